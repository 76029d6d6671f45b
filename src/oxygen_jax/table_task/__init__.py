"""The demo table tasks: `pi05_demo`'s rendered scenes, their scripted dataset and scoring on held-out
scenes; the detour task of `pi05_detour` (two valid motions around a block) and its closed-loop evaluation
under simulated latency. Training and evaluation tools import it; it imports only policies, the robot-side
client and the LeRobot format."""
