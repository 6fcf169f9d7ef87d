"""The bottom layer: the error taxonomy, what every command shares, file locks and KB names."""
