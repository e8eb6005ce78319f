"""Real parts for cluster tests and benchmarks: an S3-compatible server on this machine (moto's server mode, with
signed requests checked against keys it issued) that can be stopped and started again on the same port, and a Ray
cluster of several nodes on this machine (ray.cluster_utils) whose nodes can be killed."""
from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

OBJECT_STORE_BYTES = 100 * 1024 * 1024


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class S3Server:
    """moto's S3 server on 127.0.0.1, a bucket, and an access key of an IAM user that may do anything: with auth on,
    a request signed with another key fails as S3 fails it (SignatureDoesNotMatch, InvalidAccessKeyId)."""

    def __init__(self, bucket: str = "tiered-recall-test", *, auth: bool = True, process: bool = False) -> None:
        """process: run the server in a process of its own (a benchmark's client then has this process's cores to
        itself); else in a thread of this process, where stop() and start() can take it away and back."""
        import logging

        import boto3
        import requests
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self._server_class = ThreadedMotoServer
        self._process = None
        if process:
            import subprocess
            import sys
            from pathlib import Path

            command = [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)]
            self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while not _listening(self.port):
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.1)
        else:
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
        self.running = True
        requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"inf", timeout=10)
        iam = boto3.client("iam", endpoint_url=self.endpoint, aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap", region_name="us-east-1")
        user = f"tiered-recall-{uuid.uuid4().hex[:12]}"  # moto's state outlives a server in this process
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        self.client().create_bucket(Bucket=bucket)
        if auth:
            requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"0", timeout=10)

    def client(self):
        """A boto3 S3 client with the server's key."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def options(self, **changes: str) -> dict[str, str]:
        """LanceDB's storage options for this server (changes: e.g. a wrong aws_secret_access_key)."""
        return {"aws_endpoint": self.endpoint, "aws_region": "us-east-1", "allow_http": "true",
                "aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key, **changes}

    def uri(self, prefix: str) -> str:
        """s3://<bucket>/<prefix>."""
        return f"s3://{self.bucket}/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        """The object keys under a prefix."""
        listed = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in listed for o in page.get("Contents", [])]

    def stop(self) -> None:
        """Stops answering (the objects stay: start() serves them again on the same port)."""
        if self._process is not None:
            raise RuntimeError("a server in a process of its own is not stopped and started again: close() it")
        if self.running:
            self._server.stop()
            self.running = False

    def start(self) -> None:
        """Serves again on the same port, the objects as they were."""
        if not self.running:
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._server = self._server_class(ip_address="127.0.0.1", port=self.port, verbose=False)
                    self._server.start()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            self.running = True

    def close(self) -> None:
        """Stops the server for good."""
        import requests

        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=30)
            self.running = False
            return
        if self.running:
            requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"inf", timeout=10)
        self.stop()


class RayNodes:
    """A Ray cluster of a head and `workers` nodes on this machine, each with `cpus` CPUs to give out and a small
    object store, this process connected to it; kill() removes a node as a crash would."""

    def __init__(self, workers: int = 2, cpus: int = 2, head_cpus: int = 2, temp_dir: str | None = None,
                 head_gpus: int = 0) -> None:
        import ray
        from ray.cluster_utils import Cluster

        head: dict[str, Any] = {"num_cpus": head_cpus, "num_gpus": head_gpus, "include_dashboard": False,
                                "object_store_memory": OBJECT_STORE_BYTES}
        if temp_dir is not None:
            head["temp_dir"] = temp_dir
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.workers = [self.cluster.add_node(num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES)
                        for _ in range(workers)]
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, namespace="tiered_recall", log_to_driver=False)
        self.address = self.cluster.address

    def node_of_id(self, node_id: str):
        """The node object of a Ray node id (None when it is gone)."""
        for node in [self.cluster.head_node, *self.workers]:
            if node.node_id == node_id:
                return node
        return None

    def kill(self, node) -> None:
        """Removes a node at once (its raylet and workers die, as when a machine is lost)."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers = [w for w in self.workers if w is not node]

    def add(self, cpus: int = 2):
        """Adds a worker node and waits until it is up."""
        node = self.cluster.add_node(num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES)
        self.workers.append(node)
        self.cluster.wait_for_nodes()
        return node

    def close(self) -> None:
        """Disconnects and shuts every node down."""
        import ray

        ray.shutdown()
        self.cluster.shutdown()
