FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=config.settings.base
WORKDIR /app
COPY . .
# collectstatic needs settings, not a real key: a build-time key is never baked into the image.
RUN pip install --no-cache-dir . ./client \
    && SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2", "--threads", "8", "--preload"]
