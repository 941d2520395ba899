"""FerryMQ: a clustered message broker in the lineage of Apache RocketMQ 5."""

__version__ = "0.1.0"
