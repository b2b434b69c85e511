"""Stable error codes of the control protocol (clients match on these strings)."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"  # JSON, but not a message object of a known shape
    UNKNOWN_TYPE = "unknown_type"
    UNEXPECTED_BINARY = "unexpected_binary"
    MESSAGE_TOO_LARGE = "message_too_large"
    TEXT_TOO_LONG = "text_too_long"
    UNKNOWN_VOICE = "unknown_voice"
    INVALID_PARAMETER = "invalid_parameter"
    SESSION_NOT_STARTED = "session_not_started"
    SESSION_ALREADY_STARTED = "session_already_started"
    DUPLICATE_TURN_ID = "duplicate_turn_id"
    UNKNOWN_TURN = "unknown_turn"
    NO_OPEN_TURN = "no_open_turn"
    TURN_QUEUE_FULL = "turn_queue_full"
    TOO_MANY_SESSIONS = "too_many_sessions"
    SERVER_BUSY = "server_busy"  # the server's live-turn limit: this turn is refused
    SERVER_DRAINING = "server_draining"  # shutting down: connect to another server
    # protection from greedy or broken clients (transport/guard.py)
    RATE_LIMITED = "rate_limited"  # messages or connections faster than allowed
    SESSION_START_TIMEOUT = "session_start_timeout"  # no session.start in time: closed
    IDLE_TIMEOUT = "idle_timeout"  # no message and nothing to send for too long: closed
    SLOW_CONSUMER = "slow_consumer"  # the client stopped reading (never sent: it can't be)
    # a WebRTC peer that never connected (never sent: there is no channel to carry it)
    CONNECT_TIMEOUT = "connect_timeout"
    # authentication and tenants (docs/security.md)
    UNAUTHORIZED = "unauthorized"  # no credential, or a wrong, revoked or expired one
    FORBIDDEN = "forbidden"  # a valid credential used outside its scope
    QUOTA_EXCEEDED = "quota_exceeded"  # the tenant's quota: sessions, turns or characters
    # telephony (docs/telephony.md)
    UNKNOWN_CALL = "unknown_call"  # no call with that token arrived in time
    CALL_ALREADY_ATTACHED = "call_already_attached"  # another bot drives that call
    INVALID_CARRIER_MESSAGE = "invalid_carrier_message"  # the carrier broke its schema
    CARRIER_ERROR = "carrier_error"  # the carrier reported an error of its own
    # the drop-in APIs (docs/compat.md)
    UNKNOWN_MODEL = "unknown_model"  # a model name the server does not offer
    UNKNOWN_CONTEXT = "unknown_context"  # a context id that is not open on this socket
    TOO_MANY_CONTEXTS = "too_many_contexts"  # a socket's open contexts are at its limit
    UNSUPPORTED_FORMAT = "unsupported_format"  # a format of the API's this server lacks
    SYNTHESIS_FAILED = "synthesis_failed"
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the LM server (SGLang) cannot be reached
    # the voice registry: POST/GET/DELETE /v1/voices (docs/voices.md); HTTP only
    VOICE_EXISTS = "voice_exists"  # the tenant already has a voice of that name (409)
    VOICE_CLONING_UNSUPPORTED = "voice_cloning_unsupported"  # no prompt frontend (501)
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # not multipart or JSON (415)
    AUDIO_TOO_LARGE = "audio_too_large"  # the upload is over the size cap (413)
    AUDIO_UNREADABLE = "audio_unreadable"  # not decodable audio, or empty (422)
    AUDIO_TOO_SHORT = "audio_too_short"  # under 1 s after trimming silence (422)
    AUDIO_TOO_LONG = "audio_too_long"  # over 30 s after trimming silence (422)
    AUDIO_CLIPPED = "audio_clipped"  # too many samples at full scale (422)
    AUDIO_SILENT = "audio_silent"  # no or too little voice activity (422)
    AUDIO_NOT_SPEECH = "audio_not_speech"  # a steady tone, hum or noise (422)
    VOICE_STORAGE_FAILED = "voice_storage_failed"  # the voices folder cannot be written (507)
    NOT_FOUND = "not_found"  # an HTTP path the server does not have (404)
    METHOD_NOT_ALLOWED = "method_not_allowed"  # a method the path does not take (405)
    INTERNAL_ERROR = "internal_error"


class ProtocolError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CloseCode:
    """WebSocket close codes the server uses."""

    NORMAL = 1000
    GOING_AWAY = 1001
    POLICY_VIOLATION = 1008  # a telephony peer broke its platform's protocol
    TRY_AGAIN_LATER = 1013  # server at its session limit
