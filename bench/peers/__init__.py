"""Side-by-side benchmark of FerryMQ against NATS JetStream, Redis Streams and RabbitMQ: `python -m bench.peers`."""
