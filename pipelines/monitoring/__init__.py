"""What the pipeline tells about itself: Prometheus metrics (the stream's exporter, the batch jobs'
pushes to a Pushgateway), OpenLineage events and the Grafana dashboard.
"""
