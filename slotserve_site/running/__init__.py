"""The parts `manage.py run` starts and supervises on one machine: their command lines
(`parts.py`), the embedded Redis (`embedded_redis.py`) and the demo (`demo.py`)."""
