// What the page tells the person besides the face: the connection's message and errors
// (floating over the face, so they never move the controls), the Details log, and the
// live regions a screen reader speaks from.

const MAX_LOG = 300;
const MAX_ERRORS_SHOWN = 3;

export class Messages {
  /** `els`: connMessage, connMessageText, errors, log, alert, status (elements);
   *  `afterDismiss()`: where the focus goes when a dismissed message took it along. */
  constructor(els, afterDismiss) {
    this.els = els;
    this.afterDismiss = afterDismiss;
    this.conn = null; // {text, tone}: the connection's message, or null
    this.errors = []; // shown now: {code, text, message}
    this.log = []; // everything that went wrong or changed: {at, text}
    this.announcements = []; // what the live regions said: {kind, text, t}
  }

  /** Say `text` to screen readers: "alert" interrupts (errors, barge-ins), "status" waits. */
  announce(text, kind = "status") {
    this.announcements.push({ kind, text, t: Math.round(performance.now()) });
    if (this.announcements.length > 50) this.announcements.shift();
    const region = kind === "alert" ? this.els.alert : this.els.status;
    // cleared first, so the same words said twice are announced twice
    region.textContent = "";
    setTimeout(() => {
      region.textContent = text;
    }, 50);
  }

  /** A line in the Details log (codes and all). */
  line(text) {
    const at = new Date().toLocaleTimeString();
    this.log.push({ at, text });
    if (this.log.length > MAX_LOG) this.log.shift();
    const li = document.createElement("li");
    li.textContent = `${at} ${text}`;
    this.els.log.append(li);
    while (this.els.log.children.length > 100) this.els.log.firstElementChild.remove();
    this.els.log.scrollTop = this.els.log.scrollHeight;
  }

  /** The connection's message (null: none); tone: warn, info or error. */
  setConn(text, tone = "warn") {
    this.conn = text ? { text, tone } : null;
    const box = this.els.connMessage;
    box.hidden = !text;
    box.dataset.tone = tone;
    this.els.connMessageText.textContent = text || "";
  }

  /** An error in plain words, the server's own message under it; it can be dismissed. */
  error(text, serverMessage = null, code = null) {
    const error = { code, text, message: serverMessage };
    this.errors.push(error);
    this.line(`error${code ? ` ${code}` : ""}: ${text}${serverMessage ? ` (server: ${serverMessage})` : ""}`);
    const li = document.createElement("li");
    li.className = "message error";
    const words = document.createElement("span");
    words.textContent = text;
    if (serverMessage) {
      const small = document.createElement("small");
      small.textContent = `server: ${serverMessage}`;
      words.append(small);
    }
    const dismiss = document.createElement("button");
    dismiss.type = "button";
    dismiss.className = "dismiss";
    dismiss.textContent = "×";
    dismiss.setAttribute("aria-label", "Dismiss this message");
    dismiss.addEventListener("click", () => {
      const i = this.errors.indexOf(error);
      if (i >= 0) this.errors.splice(i, 1);
      li.remove();
      this.afterDismiss(); // the button that had the focus is gone
    });
    li.append(words, dismiss);
    this.els.errors.append(li);
    while (this.els.errors.children.length > MAX_ERRORS_SHOWN) this.els.errors.firstElementChild.remove();
    this.announce(text, "alert");
  }

  clearErrors() {
    this.errors = [];
    this.els.errors.replaceChildren();
  }
}
