"""The demo table tasks: `pi05_demo`'s rendered scenes, their scripted dataset and scoring on held-out
scenes; the detour task of `pi05_detour` (two valid motions around a block) and its moving variant, their
worlds, demonstrations and datasets. Training and evaluation (the closed loops: `evaluation/closed_loop.py`)
import it; it imports only policies, the robot-side client and the LeRobot format."""
