"""Helpers shared by the test suites (a real Kafka broker for the ``kafka`` tests)."""
