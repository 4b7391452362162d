"""The inference engine that runs inside an infer task."""
