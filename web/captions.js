// Captions: the text of the turn being heard, one span per word, with the word heard now
// marked. The words and their times come from `turn.words` events (ms on the turn's audio
// timeline, the same timeline as audio.levels); the position heard now comes from the
// LevelClock, so the mark follows the audio as the listener hears it on both transports.
// A segment's words come once its speech tokens are known: for the first segment of a
// turn that can be a little after its first audio is heard (docs/protocol.md). Until then
// the text the page sent is shown unmarked, and the words not timed yet stay unmarked.

const PLACEHOLDER = "What the avatar says appears here as it says it.";

export class Captions {
  constructor(box) {
    this.box = box;
    this.turns = new Map(); // turn_id -> {words: [{word, start, end}], segments: [...]}
    this.texts = new Map(); // turn_id -> the text the page sent for it
    this.shown = null; // turn_id on screen
    this.spans = []; // one per timed word of the turn on screen
    this.index = -1; // word marked now (-1: none yet)
    this.position = null;
    this.ended = false;
    this.placeholder();
  }

  placeholder() {
    this.box.classList.add("empty");
    this.box.textContent = PLACEHOLDER;
  }

  /** The text the page sent for a turn: shown, unmarked, until its words come. */
  expect(turnId, text) {
    this.texts.set(turnId, text);
  }

  /** A `turn.words` event: one more segment of a turn's words. */
  add(turnId, event) {
    let t = this.turns.get(turnId);
    if (!t) {
      t = { words: [], segments: [] };
      this.turns.set(turnId, t);
    }
    const words = Array.isArray(event.words) ? event.words : [];
    const added = words.map((w) => ({ word: String(w.word), start: Number(w.start_ms), end: Number(w.end_ms) }));
    t.words.push(...added);
    t.words.sort((a, b) => a.start - b.start);
    t.segments.push({ start_ms: event.start_ms, end_ms: event.end_ms, at: Math.round(performance.now()) });
    if (this.shown === turnId) this.render(turnId, true);
  }

  has(turnId) {
    return this.turns.has(turnId);
  }

  /** Forget everything (a new session numbers its turns again; ids stay unique). */
  clear() {
    this.turns.clear();
    this.shown = null;
    this.index = -1;
    this.position = null;
    this.placeholder();
  }

  /** The words of the sent text that no turn.words event has timed yet (when the timed
   *  words are the text's first ones, as in languages written with spaces). */
  untimed(turnId, timed) {
    const words = (this.texts.get(turnId) || "").split(/\s+/).filter(Boolean);
    for (let i = 0; i < timed.length; i++) if (words[i] !== timed[i].word) return [];
    return words.slice(timed.length);
  }

  render(turnId, force = false) {
    if (this.shown === turnId && !force) return;
    const t = this.turns.get(turnId) || { words: [], segments: [] };
    if (this.shown !== turnId) {
      this.index = -1;
      this.box.scrollTop = 0;
    }
    this.shown = turnId;
    this.box.classList.remove("empty");
    this.box.replaceChildren();
    const add = (word, cls) => {
      if (this.box.childNodes.length) this.box.append(" ");
      const span = document.createElement("span");
      span.textContent = word;
      span.className = cls;
      this.box.append(span);
    };
    for (const w of t.words) add(w.word, "ahead");
    this.spans = [...this.box.querySelectorAll("span")];
    for (const w of this.untimed(turnId, t.words)) add(w, "ahead untimed");
    if (this.index >= 0) this.show(turnId, this.position ?? 0, this.ended);
  }

  /** Show `turnId` heard up to `positionMs` (Infinity: all of it; `ended`: it will not
   *  go on, e.g. it was cut off there). Returns the index of the word marked now. */
  show(turnId, positionMs, ended = false) {
    // within a turn the position heard only moves on: the clock re-anchors on every
    // audio chunk, and a few ms of jitter back at a word's edge must not flicker the mark
    if (turnId === this.shown && !ended && this.position !== null && !this.ended) {
      positionMs = Math.max(positionMs, this.position);
    }
    this.render(turnId);
    this.box.classList.toggle("ended", ended);
    this.ended = ended;
    this.position = positionMs;
    const t = this.turns.get(turnId);
    if (!t) return -1;
    // the word heard now: the last one that has started (none while still before the first)
    let k = -1;
    for (let i = 0; i < t.words.length && t.words[i].start <= positionMs; i++) k = i;
    const inside = k >= 0 && positionMs < t.words[k].end && !ended;
    const marked = inside ? k : -1;
    t.words.forEach((w, i) => {
      const cls = i === marked ? "now" : i <= k && (i < k || positionMs >= w.end || ended) ? "said" : "ahead";
      const span = this.spans[i];
      if (span && span.className !== cls) span.className = cls;
    });
    // a turn heard to its end: words never timed (text the server did not speak) read as said
    if (positionMs === Infinity) for (const span of this.box.querySelectorAll(".untimed")) span.className = "said";
    if (k !== this.index && k >= 0) this.follow(this.spans[k]);
    this.index = k;
    return marked;
  }

  /** Keep the word heard now in view (the box shows a few lines). */
  follow(span) {
    if (!span) return;
    const box = this.box;
    const top = span.offsetTop - box.offsetTop;
    const line = span.offsetHeight || 20;
    if (top + line > box.scrollTop + box.clientHeight || top < box.scrollTop) {
      box.scrollTop = Math.max(0, top - line);
    }
  }

  /** What the tests read: the turn shown, the word marked now and the words' times. */
  snapshot() {
    const t = this.shown ? this.turns.get(this.shown) : null;
    const now = this.box.querySelector(".now");
    return {
      turn_id: this.shown,
      index: this.index,
      marked: now ? this.spans.indexOf(now) : -1,
      word: now ? now.textContent : null,
      position_ms: Number.isFinite(this.position) ? Math.round(this.position) : null,
      ended: this.ended,
      words: t ? t.words.map((w) => [w.word, w.start, w.end]) : [],
      segments: t ? t.segments : [], // when each turn.words event arrived (performance.now())
    };
  }
}
