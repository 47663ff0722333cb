"""Devices that core provides itself: NULL (compile without running) and DISK (files as uint8 tensors)."""
