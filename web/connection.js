// What the page says about its connection, in plain words, and when it tries again.
// Every way a connection can end or fail to start maps to one sentence a person can act
// on; close codes and error codes stay in the Details log.

/** A failed attempt to connect: `kind` says what to do next.
 *  unreachable: nothing answered (the server is down or restarting): try again later.
 *  refused: the server answered "not now" (`code`: server_draining, too_many_sessions,
 *           quota_exceeded, rate_limited): try again later.
 *  denied: the server refused this page's credential: trying again will not help.
 *  path: WebRTC's audio path could not be set up (blocked ICE, an offer the server
 *        rejects, no WebRTC in the browser): use the WebSocket instead.
 *  unsupported: this browser cannot use the transport at all. */
export class ConnectError extends Error {
  constructor(kind, message, code = null) {
    super(message);
    this.kind = kind;
    this.code = code;
  }
}

const REFUSALS = {
  server_draining: "The server is restarting.",
  too_many_sessions: "The server is full right now.",
  quota_exceeded: "Your account has as many sessions open as it may.",
  rate_limited: "The page tried to connect too often.",
};

/** The sentence for a connection that could not be made. */
export function failureText(err) {
  if (err.kind === "refused") return REFUSALS[err.code] || "The server turned the connection down.";
  if (err.kind === "denied") {
    return "The server refused this page: its access token is missing, wrong or expired. Ask for a new link.";
  }
  if (err.kind === "unreachable") return "Cannot reach the server.";
  if (err.kind === "session") return "The server did not start a session.";
  return "Could not connect.";
}

/** The sentence for a connection that ended, and whether to reconnect by itself.
 *  `info`: {code, reason} of a closed WebSocket, or {why} from WebRTC; `refusal`: the
 *  error code the server sent just before closing, if any. */
export function lostText(info, refusal = null) {
  if (refusal && REFUSALS[refusal]) return { text: REFUSALS[refusal], retry: true };
  if (info.why) {
    switch (info.why) {
      case "stall":
        return { text: "The audio from the server stopped: the connection was lost.", retry: true };
      case "closed":
        return { text: "The server ended the session (it may be restarting).", retry: true };
      default:
        return { text: "The connection to the server was lost.", retry: true };
    }
  }
  switch (info.code) {
    case 1000:
      return { text: "The server ended the session.", retry: true };
    case 1001:
      return { text: "The server is shutting down (usually for a restart).", retry: true };
    case 1008:
      if (info.reason === "idle_timeout") {
        return { text: "The server closed the session because nothing happened for a while.", retry: false };
      }
      if (info.reason === "session_start_timeout") return { text: "The session did not start in time.", retry: true };
      return { text: "The server closed the session because of its rules for this page.", retry: false };
    case 1011:
      return { text: "The connection stopped responding.", retry: true };
    case 1012:
      return { text: "The server restarted.", retry: true };
    case 1013:
      return { text: REFUSALS[info.reason] || "The server is busy.", retry: true };
    case 1002:
    case 1007:
    case 1009:
      return { text: "The page and the server fell out of step (a bug in the page).", retry: true };
    case 1006:
      return { text: "The connection to the server was lost.", retry: true };
    default:
      return { text: "The connection closed unexpectedly.", retry: true };
  }
}

/** Exponential backoff: first after `firstMs`, doubling up to `maxMs`, with ±20 % jitter
 *  so that many pages do not come back at the same instant. */
export class Backoff {
  constructor(firstMs = 500, maxMs = 4000) {
    this.firstMs = firstMs;
    this.maxMs = Math.max(firstMs, maxMs);
    this.failures = 0;
  }

  next() {
    const base = Math.min(this.maxMs, this.firstMs * 2 ** this.failures);
    this.failures += 1;
    return Math.round(base * (0.8 + 0.4 * Math.random()));
  }

  reset() {
    this.failures = 0;
  }
}

/** A number from the page's query string, or `fallback`. */
export function queryMs(name, fallback) {
  const v = Number(new URLSearchParams(location.search).get(name));
  return Number.isFinite(v) && v > 0 ? v : fallback;
}
