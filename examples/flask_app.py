"""The Flask example (README.md, "Flask"): a task that reads the app's config through
``current_app``, sent from a route and run by ``flask --app examples.flask_app pyqueue
worker``; tests/test_flask.py runs it."""

from flask import Flask, current_app, jsonify

from pyqueue.contrib.flask import PyQueue

pq = PyQueue()


@pq.task(keep_result=60)
def greet(name: str) -> str:
    return f"{current_app.config['GREETING']}, {name}!"   # runs inside the app's context


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["GREETING"] = "Hello"
    app.config.from_prefixed_env()   # FLASK_PYQUEUE_URL=redis://..., FLASK_PYQUEUE_PREFIX=...
    pq.init_app(app)

    @app.post("/greet/<name>")
    def send_greeting(name: str):
        return jsonify(job=greet.send(name).id)

    return app
