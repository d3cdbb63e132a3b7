"""app/learn: learning the interference model from Freeze'nSense samples."""
