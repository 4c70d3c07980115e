"""Model backends behind one small interface."""
