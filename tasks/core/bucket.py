"""The object store the service ships its log segments to, and the monitor and retrain read them from
(`serve.ship_to: s3://bucket/prefix`). boto3 finds the endpoint and the credentials in the environment
(AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or its other usual places):
none of them is ever in params.yaml, a log line or a command line. Errors name the bucket and what to set, never a
key."""
from __future__ import annotations

from dataclasses import dataclass

from tasks.core.artifacts import redacted
from tasks.core.env import AWS_ENDPOINT_ENV, AWS_KEY_ID_ENV, AWS_SECRET_ENV
from tasks.core.errors import TorchshipError
from tasks.core.params_spec import S3_URL

REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "403"}
# A few quick tries per call, each bounded: a shipper retries a failed segment at its next round, and a clean stop
# must end in bounded time even when the store is down.
ATTEMPTS, CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 3, 3.0, 20.0


class BucketError(TorchshipError):
    """The store refused or could not be reached; the message says which and what to set."""


@dataclass(frozen=True)
class Location:
    """`s3://bucket/prefix`: where segments go, split once."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Location:
        found = S3_URL.fullmatch(url)
        if found is None:
            raise ValueError(f"{url!r} is not s3://<bucket>[/<prefix>] (serve.ship_to's rule)")
        return cls(found["bucket"], (found["prefix"] or "").strip("/"))

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key or self.prefix}"


def s3_client():
    """An S3 client as boto3 configures it from the environment, with bounded tries and timeouts."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise BucketError("serve.ship_to needs boto3 on this host: pip install 'boto3<1.43.118' (or the project's "
                          "`stack` extra)") from None

    return boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": ATTEMPTS},
                                            connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S))


def explained(exc: Exception, location: Location, doing: str, key: str = "") -> BucketError:
    """A failure as a BucketError that says what really happened and what to do: a refusal by its code, only a
    connection failure as "could not be reached"; anything else by its own type and its message redacted
    (tasks/core/artifacts.py `redacted`: a message might quote the request or a credential)."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        why = f"no credentials: set {AWS_KEY_ID_ENV} and {AWS_SECRET_ENV} in the environment"
    elif isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", "?"))
        why = (f"the store refused the credentials ({code}): check {AWS_KEY_ID_ENV} and {AWS_SECRET_ENV} (and that "
               "the key may use this bucket)" if code in REFUSED else f"the store answered {code}")
    elif isinstance(exc, (ConnectionError, HTTPClientError)):   # refused, no such endpoint, timed out, closed
        why = (f"the store could not be reached or did not answer ({type(exc).__name__}): check "
               f"{AWS_ENDPOINT_ENV}_S3 or {AWS_ENDPOINT_ENV}")
    elif isinstance(exc, UnicodeDecodeError):
        why = (f"the object is not UTF-8 text ({type(exc).__name__} at byte {exc.start}): it was not written by "
               "torchship, or it was damaged")
    else:
        why = f"it failed with {redacted(exc)}"
    return BucketError(f"could not {doing} {location.url(key)}: {why}")


def put_bytes(client, location: Location, key: str, body: bytes) -> None:
    """One PUT: S3 makes an object visible only once it is whole, so a reader never lists half a segment."""
    try:
        client.put_object(Bucket=location.bucket, Key=key, Body=body)
    except Exception as exc:
        raise explained(exc, location, "upload to") from None


def list_keys(client, location: Location, under: str) -> list[str]:
    """Every key below `<prefix>/<under>/`, in key order."""
    folder = "/".join(part for part in (location.prefix, under) if part) + "/"
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=folder)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]
    except Exception as exc:
        raise explained(exc, location, "list") from None


def get_text(client, location: Location, key: str) -> str:
    try:
        return client.get_object(Bucket=location.bucket, Key=key)["Body"].read().decode("utf-8")
    except Exception as exc:
        raise explained(exc, location, "read", key) from None
