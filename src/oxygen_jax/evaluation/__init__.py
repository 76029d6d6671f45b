"""Closed-loop evaluation: simulator rollouts (LIBERO, ALOHA sim) and the DROID robot client."""
