// Microphone and speaker pickers: the browser's audio devices (enumerateDevices), kept up
// to date when devices come and go. Labels are empty until the page may use the
// microphone; the pickers then number the devices instead.

/** getUserMedia's audio constraints: echo cancellation on, the chosen device if any. */
export function micConstraints(deviceId) {
  const audio = { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 };
  if (deviceId) audio.deviceId = { exact: deviceId };
  return audio;
}

function fill(select, devices, defaultLabel, noun) {
  const keep = select.value;
  const options = [new Option(defaultLabel, "")];
  let n = 0;
  for (const d of devices) {
    if (d.deviceId === "default" || d.deviceId === "" || d.deviceId === "communications") continue;
    n += 1;
    options.push(new Option(d.label || `${noun} ${n}`, d.deviceId));
  }
  select.replaceChildren(...options);
  select.value = options.some((o) => o.value === keep) ? keep : "";
}

export class DevicePickers {
  /** `onChange(kind, deviceId)` is called when the person picks another device. */
  constructor(micSelect, speakerSelect, speakerNote, onChange) {
    this.mic = micSelect;
    this.speaker = speakerSelect;
    this.note = speakerNote;
    this.list = { mics: [], speakers: [] };
    this.mic.addEventListener("change", () => onChange("mic", this.mic.value));
    this.speaker.addEventListener("change", () => onChange("speaker", this.speaker.value));
    if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
      navigator.mediaDevices.addEventListener("devicechange", () => this.refresh());
    }
  }

  async refresh() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) {
      this.mic.replaceChildren(new Option("Default microphone", ""));
      this.speaker.replaceChildren(new Option("Default speaker", ""));
      return;
    }
    let devices = [];
    try {
      devices = await navigator.mediaDevices.enumerateDevices();
    } catch {
      devices = [];
    }
    const mics = devices.filter((d) => d.kind === "audioinput");
    const speakers = devices.filter((d) => d.kind === "audiooutput");
    this.list = {
      mics: mics.map((d) => ({ id: d.deviceId, label: d.label })),
      speakers: speakers.map((d) => ({ id: d.deviceId, label: d.label })),
    };
    fill(this.mic, mics, "Default microphone", "Microphone");
    fill(this.speaker, speakers, "Default speaker", "Speaker");
  }

  /** Whether the transport in use can pick a speaker; says so next to the picker. */
  setSpeakerSupport(supported, transportName) {
    this.speaker.disabled = !supported;
    this.note.hidden = supported;
    this.note.textContent = supported
      ? ""
      : `This browser cannot choose a speaker for ${transportName} audio: sound goes to the system's default output.`;
  }
}
