"""The demo table task of `pi05_demo`: rendered scenes, their scripted dataset, and scoring a policy on
held-out scenes. Training and evaluation tools import it; it imports only policies and the LeRobot format."""
