"""gunicorn's settings for every way Runcast starts it (compose, the Dockerfile, scripts/dev,
systemd): gunicorn reads ./gunicorn.conf.py from the directory it starts in."""

# A legal MLflow request must fit its request line: get-history-bulk-interval with 100 run ids
# (MLflow's maximum) is ~4,300 bytes, over gunicorn's default of 4,094, which answered with an
# HTML 400 the client cannot read. 8,190 is gunicorn's largest.
limit_request_line = 8190
