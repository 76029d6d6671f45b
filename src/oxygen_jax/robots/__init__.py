"""A robot's room: one robot's state and the one sequence its requests take (`robot.py`), on the inline
runtime (`local.py`) or many robots on the shared one (`robots.py`); real-time chunking's per-robot state
(`chunks.py`) and the robot side of the closed-loop evaluations (`trial.py`, `bid_robot.py`)."""
