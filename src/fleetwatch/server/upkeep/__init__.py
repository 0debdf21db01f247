"""The fleet-wide upkeep passes that judge nothing: hourly rollups, retention, GPU lifetimes and the
risk models' refits."""
