"""The store's location on the wire (``GET /v1/store``)."""

from __future__ import annotations

from pydantic import BaseModel

from control_plane.services.store_location import StoreLocation


class StorePublic(BaseModel):
    url: str  # an absolute directory on the server's machine, or s3://bucket/prefix
    s3_endpoint_url: str | None = None  # S3 only; None: AWS
    s3_region: str | None = None

    @classmethod
    def of(cls, location: StoreLocation) -> StorePublic:
        return cls(**location.__dict__)
