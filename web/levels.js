// The lip-sync clock: audio.levels events arrive before their audio plays; this releases
// each level on the page's playback clock instead. A transport tells it, per turn, when
// (performance.now() milliseconds) some offset of the turn's audio timeline plays — an
// "anchor": the WebSocket player reports one per 20 ms chunk it starts rendering, WebRTC
// derives one from each audio.sync event plus the receiver's jitter-buffer delay. The
// level shown at time `now` is the one of the frame at
//   anchor.offset + (now - anchor.at)
// of the turn whose latest anchor is the most recent one at or before `now`.

export class LevelClock {
  constructor() {
    this.turns = new Map(); // turn number -> TurnTrack
    this.dropped = new Set(); // cancelled turns: late levels and anchors are ignored
    this.ends = new Map(); // turn number -> when its last audio was heard (pruned turns)
  }

  track(turn) {
    let t = this.turns.get(turn);
    if (!t) {
      t = { levels: new Map(), frameMs: 20, anchors: [], endMs: null, lastAt: -Infinity };
      this.turns.set(turn, t);
    }
    return t;
  }

  /** Loudness of the turn's frames from `offsetMs` on, one value per `frameMs`. */
  addLevels(turn, offsetMs, frameMs, levels) {
    if (this.dropped.has(turn)) return;
    const t = this.track(turn);
    t.frameMs = frameMs || 20;
    const first = Math.round(offsetMs / t.frameMs);
    levels.forEach((v, i) => t.levels.set(first + i, Math.max(0, Math.min(1, Number(v) || 0))));
  }

  /**
   * The turn's audio at `offsetMs` plays at `atMs` (performance.now() time). `holdMs`:
   * how long past this anchor the position may be extrapolated before the turn counts as
   * not playing (the WebSocket player anchors every chunk, so a short hold detects an
   * underrun; WebRTC anchors only at starts and after gaps).
   */
  anchor(turn, offsetMs, atMs, holdMs = Infinity) {
    if (this.dropped.has(turn)) return;
    const t = this.track(turn);
    t.anchors.push({ offset: offsetMs, at: atMs, hold: holdMs });
    t.anchors.sort((a, b) => a.at - b.at);
    t.lastAt = Math.max(t.lastAt, atMs);
  }

  /** The turn's audio is this long (turn.done sent_ms): nothing plays past it. */
  end(turn, sentMs) {
    if (this.turns.has(turn)) this.turns.get(turn).endMs = sentMs;
  }

  /** Whether any of the turn's audio has been anchored (it left the server, or plays). */
  anchored(turn) {
    const t = this.turns.get(turn);
    return !!t && (t.anchors.length > 0 || t.lastAt > -Infinity);
  }

  /** A cancelled turn: its pending levels and anchors are dropped at once. */
  drop(turn) {
    this.turns.delete(turn);
    this.dropped.add(turn);
  }

  /** A new session: turn numbers start again. */
  dropAll() {
    this.turns.clear();
    this.dropped.clear();
    this.ends.clear();
  }

  /** When (performance.now() time) the turn's last audio is heard, as far as its latest
   *  anchor tells; null while its length (turn.done) or any anchor is unknown. */
  endAt(turn) {
    const t = this.turns.get(turn);
    if (!t) return this.ends.get(turn) ?? null;
    if (t.endMs === null || t.anchors.length === 0) return null;
    const a = t.anchors[t.anchors.length - 1];
    return a.at + (t.endMs - a.offset);
  }

  /** Whether some of the turn's audio is still to be heard after `now`: it may still
   *  arrive (length unknown), waits to start, or plays. */
  pending(turn, now) {
    const t = this.turns.get(turn);
    if (!t) return false;
    const end = this.endAt(turn);
    return end === null ? t.endMs !== 0 : end > now;
  }

  /** What plays at `now`: {turn, offsetMs, level} or null when nothing does. */
  at(now) {
    let best = null;
    for (const [turn, t] of this.turns) {
      // the latest anchor at or before now; older ones are no longer needed
      let k = -1;
      for (let i = 0; i < t.anchors.length && t.anchors[i].at <= now; i++) k = i;
      if (k < 0) continue;
      if (k > 0) t.anchors.splice(0, k);
      const a = t.anchors[0];
      if (best && a.at < best.anchorAt) continue;
      if (now - a.at > a.hold) continue;
      const offsetMs = a.offset + (now - a.at);
      if (t.endMs !== null && offsetMs >= t.endMs) continue;
      const level = t.levels.get(Math.floor(offsetMs / t.frameMs));
      best = { turn, offsetMs, level: level ?? 0, known: level !== undefined, anchorAt: a.at };
    }
    return best;
  }

  /** How much of the turn has played by `now` (ms of its audio), as far as anchors tell:
   *  the playback reports the page sends to the server. */
  playedMs(turn, now) {
    const t = this.turns.get(turn);
    if (!t) return 0;
    let a = null;
    for (const x of t.anchors) if (x.at <= now) a = x;
    if (!a) return 0;
    const ms = a.offset + Math.min(now - a.at, a.hold);
    return Math.max(0, t.endMs === null ? ms : Math.min(ms, t.endMs));
  }

  /** Forget turns whose audio ended (or went silent) a while ago. */
  prune(now, keepMs = 5000) {
    for (const [turn, t] of this.turns) {
      if (t.anchors.length === 0) continue;
      const a = t.anchors[t.anchors.length - 1];
      const endAt = t.endMs === null ? Infinity : a.at + (t.endMs - a.offset);
      if (now - Math.min(endAt, a.at + a.hold) > keepMs) {
        if (Number.isFinite(endAt)) this.ends.set(turn, endAt);
        this.turns.delete(turn);
      }
    }
  }
}
