"""What the gateway counted, from Redis into the database and back out as usage: the flush of
the counts (``flush``), the request log (``request_log``) and its roll-ups (``rollups``), the
reports (``reports``; ``utilisation`` does the counting, pure) and their page, CSV and API
(``views``)."""
