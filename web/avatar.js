// The SVG digital human: mouth opening follows the loudness level of what plays now,
// the eyes blink now and then, the head sways a little while speaking. `update(level,
// now)` is called once per animation frame with the level the LevelClock released (0
// when nothing plays); the mouth then rests closed.

const MOUTH_Y = 238;
const MAX_OPEN = 22; // px of opening at mouthOpen = 1

/** Loudness level (0..1 = -60..0 dBFS) -> target mouth opening 0..1. */
export function mouthTarget(level) {
  // below about -39 dBFS the mouth stays shut; about -9 dBFS opens it fully
  return Math.max(0, Math.min(1, (level - 0.35) / 0.5));
}

export class Avatar {
  constructor(svg) {
    this.head = svg.querySelector("#head");
    this.inner = svg.querySelector("#mouth-inner");
    this.clip = svg.querySelector("#mouth-clip-shape");
    this.upper = svg.querySelector("#lip-upper");
    this.lower = svg.querySelector("#lip-lower");
    this.teeth = svg.querySelector("#teeth");
    this.tongue = svg.querySelector("#tongue");
    this.lids = [...svg.querySelectorAll(".lid")];
    this.open = 0; // smoothed mouth opening 0..1
    this.activity = 0; // smoothed "is speaking" 0..1, for the sway
    this.last = null;
    this.nextBlink = performance.now() + 1500;
    this.blinkStart = -1;
    this.swayPhase = 0;
  }

  update(level, now) {
    // The mouth follows the wall clock, however far apart the frames: a busy browser that
    // draws every 300 ms still shows the mouth where the audio is (it lagged when a
    // frame counted at most 100 ms). The sway keeps the cap: it must not jump.
    const elapsed = this.last === null ? 16 : Math.max(0, now - this.last);
    const dt = Math.min(100, elapsed);
    this.last = now;
    const target = mouthTarget(level);
    // fast attack, slightly slower release, like a jaw
    const tau = target > this.open ? 25 : 45;
    this.open += (target - this.open) * (1 - Math.exp(-elapsed / tau));
    if (this.open < 0.01 && target === 0) this.open = 0;
    const speaking = level > 0.05 ? 1 : 0;
    this.activity += (speaking - this.activity) * (1 - Math.exp(-elapsed / (speaking ? 150 : 600)));
    this.drawMouth(this.open);
    this.drawBlink(now);
    this.drawSway(dt);
  }

  drawMouth(open) {
    // Quadratic curves from corner to corner; a curve's middle is at (corner + control) / 2,
    // so control = 2 * middle - corner.
    const g = open * MAX_OPEN; // the gap between the lips at the middle
    const w = 28 - 4 * open; // half width: the corners come in as the jaw drops
    const l = (150 - w).toFixed(2);
    const r = (150 + w).toFixed(2);
    const yc = MOUTH_Y + 0.25 * g; // corners
    const upperIn = MOUTH_Y - 0.15 * g; // middle of the upper lip's lower edge
    const lowerIn = MOUTH_Y + 0.85 * g + 1; // middle of the lower lip's upper edge
    const c = (mid) => (2 * mid - yc).toFixed(2);
    const f = (y) => y.toFixed(2);
    const inner = `M${l} ${f(yc)} Q150 ${c(upperIn)} ${r} ${f(yc)} Q150 ${c(lowerIn)} ${l} ${f(yc)} Z`;
    this.inner.setAttribute("d", inner);
    this.clip.setAttribute("d", inner);
    const top = upperIn - 5; // the cupid's bow dips to here in the middle
    this.upper.setAttribute(
      "d",
      `M${l} ${f(yc)} Q136 ${f(top - 5)} 150 ${f(top)} Q164 ${f(top - 5)} ${r} ${f(yc)}` +
        ` Q150 ${c(upperIn)} ${l} ${f(yc)} Z`,
    );
    this.lower.setAttribute(
      "d",
      `M${l} ${f(yc)} Q150 ${c(lowerIn)} ${r} ${f(yc)} Q150 ${c(lowerIn + 9)} ${l} ${f(yc)} Z`,
    );
    this.teeth.setAttribute("y", f(upperIn - 2));
    this.teeth.setAttribute("height", f(Math.min(7, 1 + 0.35 * g)));
    this.tongue.setAttribute("cy", f(lowerIn + 2));
  }

  drawBlink(now) {
    if (this.blinkStart < 0 && now >= this.nextBlink) this.blinkStart = now;
    let closed = 0;
    if (this.blinkStart >= 0) {
      const t = (now - this.blinkStart) / 160; // a blink takes 160 ms
      closed = t < 0.5 ? t * 2 : Math.max(0, 2 - t * 2);
      if (t >= 1) {
        this.blinkStart = -1;
        closed = 0;
        // every 2-6 s, sometimes a double blink
        this.nextBlink = now + (Math.random() < 0.15 ? 220 : 2000 + Math.random() * 4000);
      }
    }
    for (const lid of this.lids) lid.setAttribute("transform", `scale(1 ${closed.toFixed(3)})`);
  }

  drawSway(dt) {
    this.swayPhase += dt / 1000;
    const a = this.activity;
    const angle = a * (2.2 * Math.sin(this.swayPhase * 2.1) + 0.8 * Math.sin(this.swayPhase * 3.7));
    const nod = a * 1.5 * Math.sin(this.swayPhase * 2.9);
    this.head.setAttribute("transform", `rotate(${angle.toFixed(2)} 150 260) translate(0 ${nod.toFixed(2)})`);
  }
}
