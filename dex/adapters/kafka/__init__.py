"""The broker of the event-driven dispatch mode: Kafka (``pip install "dex-engine[kafka]"``).

:class:`~dex.adapters.kafka.notices.KafkaNotices` publishes the PostgreSQL outbox to one topic
per queue and receives the notices of an engine's queues (:mod:`dex.app.ports.notices`). It
imports ``confluent_kafka`` only when built, so ``import dex`` never needs it.
"""
