"""Closed-loop evaluation: simulator rollouts (LIBERO, ALOHA sim), the DROID robot client, and the table
tasks' closed loops under simulated latency and against a running server (`closed_loop`, `served_loop`)."""
