"""Host GPU telemetry: the models (registered in the tracker app through tracker.models), the
agent's write path in `services` and its reads in `selectors`. The agent's endpoints are in
tracker/api/gpu.py; the checks that read this telemetry are in forecasting.gpu."""
