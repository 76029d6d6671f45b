"""LeRobot v2.x datasets, read (training) and written (training data, recorded evaluations): the format
alone, so any layer may import it."""
