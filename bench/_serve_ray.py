"""The peer of ``sparseps bench serve``: the same model's ``Predictor`` behind Ray Serve.

One deployment of ``replicas`` replicas (as many as the service's workers), each a
``Predictor`` of the model folder answering the service's request bodies (JSON or Arrow,
parsed by the same ``batch_from_body``) with the same JSON or Arrow answer. Ray Serve's
HTTP proxy listens on ``127.0.0.1:port``, route ``/predict``. The deployment class is made
inside :func:`start` so that Ray pickles it by value (the bench modules are loaded by
path; its workers could not import them).
"""

from __future__ import annotations

from pathlib import Path


def start(model_dir: Path, replicas: int, port: int, cpus: int) -> str:
    """Start Ray (local, ``cpus`` CPUs), Serve and the deployment; returns its URL."""
    import ray
    from ray import serve

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")  # fmt: skip
    serve.start(http_options={"host": "127.0.0.1", "port": port})

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": 0},
                      max_ongoing_requests=256)  # fmt: skip
    class SparsepsPredictor:
        def __init__(self, directory: str) -> None:
            import torch

            from sparseps.checkpoint.predictor import Predictor

            torch.set_num_threads(1)  # as the service's --torch-threads 1
            self.predictor = Predictor(directory)
            self.schema = None

        async def __call__(self, request):
            import orjson
            import pyarrow as pa
            from starlette.responses import Response

            from sparseps.data import CRITEO
            from sparseps.serving.requests import ARROW_STREAM, batch_from_body

            body = await request.body()
            content_type = request.headers.get("content-type", "")
            batch = batch_from_body(body, content_type, CRITEO, max_rows=65536)
            predictions = self.predictor.predict_batch(batch)
            if ARROW_STREAM in request.headers.get("accept", ""):
                table = pa.record_batch([pa.array(predictions, pa.float32())], ["prediction"])
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_batch(table)
                return Response(memoryview(sink.getvalue()), media_type=ARROW_STREAM)
            payload = {"predictions": predictions, "rows": int(predictions.size)}
            return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
                            media_type="application/json")  # fmt: skip

    serve.run(SparsepsPredictor.bind(str(model_dir)), name="sparseps", route_prefix="/predict")
    return f"http://127.0.0.1:{port}"


def stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
