"""Training data: LeRobot-format datasets (read and written), norm stats, and model-level train batches."""
