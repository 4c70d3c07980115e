"""Scoring layer: rewards, group routing, tournaments, Bradley-Terry, diversity, buffers."""
