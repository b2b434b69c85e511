// The transcript: each reply of the session, numbered, with its text and what became of
// it in plain words (the same words on both transports), and notes between them for
// barge-ins and reconnects.

function secs(ms) {
  return `${(ms / 1000).toFixed(1)} s`;
}

/** A reply's state in words. */
export function statusText(rec) {
  switch (rec.status) {
    case "sent":
      return "Sending…";
    case "queued":
      return "Waiting for the reply before it";
    case "started":
      return "Preparing…";
    case "playing":
      return "Speaking";
    case "done":
      return rec.sent_ms > 0 ? `Spoken · ${secs(rec.sent_ms)}` : "Nothing to say";
    case "cancelled": {
      const heard = rec.played_ms > 0;
      if (rec.reason === "barge_in") {
        return heard ? `Interrupted when you spoke, after ${secs(rec.played_ms)}` : "Interrupted before it was heard";
      }
      return heard ? `Stopped by you after ${secs(rec.played_ms)}` : "Stopped before it was heard";
    }
    case "failed":
      return `Failed: ${rec.error || "the server could not say it"}`;
    case "ended":
      return rec.played_ms > 0
        ? `Cut off after ${secs(rec.played_ms)}: the connection was lost`
        : "Not spoken: the connection was lost";
    default:
      return rec.status;
  }
}

/** Its time to first audio, and from when it counts. */
export function ttfaText(rec) {
  if (rec.ttfa_ms === null) return "";
  const est = rec.ttfaEstimated ? " (estimated)" : "";
  return rec.ttfa_from === "previous"
    ? `first sound ${rec.ttfa_ms} ms after the reply before it${est}`
    : `first sound ${rec.ttfa_ms} ms after sending${est}`;
}

export class Transcript {
  constructor(list) {
    this.list = list;
  }

  /** Show a reply (added at the end the first time, updated in place after). */
  render(rec) {
    let li = this.list.querySelector(`li[data-turn-id="${CSS.escape(rec.turn_id)}"]`);
    if (!li) {
      li = document.createElement("li");
      li.dataset.turnId = rec.turn_id;
      li.innerHTML = '<span class="num"></span><div class="body"><p class="said"></p><p class="meta"></p></div>';
      this.list.append(li);
      this.list.scrollTop = this.list.scrollHeight;
    }
    li.dataset.status = rec.status;
    li.querySelector(".num").textContent = String(rec.seq ?? rec.turn ?? "");
    li.querySelector(".said").textContent = rec.text || "(streamed text)";
    const meta = [statusText(rec), rec.voice, ttfaText(rec)].filter(Boolean);
    li.querySelector(".meta").textContent = meta.join(" · ");
  }

  /** A line that is not a reply: a barge-in, a reconnect. */
  note(text) {
    const li = document.createElement("li");
    li.className = "note";
    li.textContent = text;
    this.list.append(li);
    this.list.scrollTop = this.list.scrollHeight;
  }
}
