"""Tickets that stand in for the API key on a fleet's redirect: good until they expire, for one key only."""

from oxygen_jax.serving import tickets

NOW = 1_800_000_000.0


def test_a_ticket_is_valid_for_its_key_until_it_expires():
    ticket = tickets.mint("s3cret", NOW)
    assert tickets.valid(ticket, "s3cret", NOW)
    assert tickets.valid(ticket, "s3cret", NOW + tickets.TICKET_TTL_S)
    assert not tickets.valid(ticket, "s3cret", NOW + tickets.TICKET_TTL_S + 1)


def test_a_ticket_minted_with_another_key_or_forged_is_not_valid():
    assert not tickets.valid(tickets.mint("other", NOW), "s3cret", NOW)
    expiry, _, signature = tickets.mint("s3cret", NOW).partition(".")
    later = str(int(expiry) + 3600)
    for forged in (f"{later}.{signature}", f"{expiry}.{'0' * len(signature)}", expiry, "", f"-1.{signature}"):
        assert not tickets.valid(forged, "s3cret", NOW)


def test_the_header_must_carry_the_key_once_as_openpi_client_sends_it():
    assert tickets.header_carries_key(["Api-Key s3cret"], "s3cret")
    for sent in ([], ["Api-Key wrong"], ["s3cret"], ["Api-Key s3cret"] * 2):
        assert not tickets.header_carries_key(sent, "s3cret")
