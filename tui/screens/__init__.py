"""The TUI's screens (runs, run with its session/group/metric/SQL tabs, transcript,
compare, message) and the panes of the run screen's tabs."""
