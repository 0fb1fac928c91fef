"""`mlflow ui --app-name miles`: MLflow's own server, whose UI opens in its model-training view in a browser
that has not chosen a view yet.

MLflow 3.17's UI ignores the experiment's `mlflow.experimentKind` tag: it picks GenAI or model training
from the page's `workflowType` query parameter, else from the browser's localStorage (what the
"GenAI | Model training" switch saved), else GenAI. This app serves MLflow's page with a script that saves
model training as that choice where none is saved yet, so every page and every click stays in the
model-training view; a user who picks GenAI keeps it.
"""
from __future__ import annotations

import json

APP_NAME = "miles"  # the `mlflow.app` entry point in pyproject.toml
WORKFLOW_TYPE_PARAM = "workflowType"  # the UI's query parameter: `genai` or `machine_learning`
MODEL_TRAINING = "machine_learning"
WORKFLOW_TYPE_STORAGE_KEY = "mlflow.workflowType_v1"  # where the UI keeps the switch's choice (key `_v` version)
DEFAULT_VIEW_SCRIPT = (
    "<script>try{if(localStorage.getItem(%s)===null)localStorage.setItem(%s,%s)}catch(e){}</script>"
    % (json.dumps(WORKFLOW_TYPE_STORAGE_KEY), json.dumps(WORKFLOW_TYPE_STORAGE_KEY),
       json.dumps(json.dumps(MODEL_TRAINING)))  # the UI stores the value JSON-encoded
)


def with_default_view(index_html: str) -> str:
    """MLflow's page with the default-view script first in <head>, before the UI's own (deferred) script reads it."""
    if "<head>" not in index_html:
        raise ValueError("MLflow's index.html has no <head>: this MLflow is not the one miles was written for")
    return index_html.replace("<head>", "<head>" + DEFAULT_VIEW_SCRIPT, 1)


def create_app():
    """The ASGI app `mlflow ui --app-name miles` serves: MLflow's FastAPI app, its page served by `index`.

    A factory, so that `mlflow ui` (which imports this module to check) does not build a server itself."""
    import os

    from flask import Response
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app

    original = flask_app.view_functions["serve"]  # MLflow's route for its page, "/" under --static-prefix
    index_path = os.path.join(flask_app.static_folder, "index.html")

    def index():
        if not os.path.exists(index_path):
            return original()  # MLflow's own explanation (a source install without the built UI)
        with open(index_path, encoding="utf-8") as f:
            return Response(with_default_view(f.read()), mimetype="text/html")

    flask_app.view_functions["serve"] = index
    return app
