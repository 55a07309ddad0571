"""The daemon's one JSON encoder and decoder (msgspec), shared by every module that writes or
reads JSON: the HTTP answers and request bodies, the envelopes, the transcript's rows.

Its own module, apart from :mod:`daemon.core.envelope`, so that what answers requests from the
start (error bodies, ``/health``, the connection limit's refusals) does not load the event
types with it. Pure.
"""

from __future__ import annotations

import msgspec

__all__ = ["decode_json", "encode_json"]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

encode_json = _encoder.encode
decode_json = _decoder.decode
