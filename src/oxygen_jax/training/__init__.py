"""Fine-tuning pi0.5: the loss (subtask text + flow matching), openpi's optimizer recipe, checkpoints."""
