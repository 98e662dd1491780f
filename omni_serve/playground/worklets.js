// Audio worklets of the playground: the microphone's PCM out, the reply's PCM in.
// The AudioContext runs at 24 kHz (the Realtime API's rate), so no resampling happens here.

class Capture extends AudioWorkletProcessor {
  // Posts the microphone's samples in 100 ms blocks (2400 samples at 24 kHz).
  constructor() {
    super();
    this.block = new Float32Array(2400);
    this.filled = 0;
  }
  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    let offset = 0;
    while (offset < input.length) {
      const n = Math.min(input.length - offset, this.block.length - this.filled);
      this.block.set(input.subarray(offset, offset + n), this.filled);
      this.filled += n;
      offset += n;
      if (this.filled === this.block.length) {
        this.port.postMessage(this.block.slice());
        this.filled = 0;
      }
    }
    return true;
  }
}

class Player extends AudioWorkletProcessor {
  // Plays queued Float32Array chunks; "clear" drops what is queued (an interruption).
  // Reports how many samples it has received and played, so the page (and a test) can tell.
  constructor() {
    super();
    this.queue = [];
    this.offset = 0;
    this.received = 0;
    this.played = 0;
    this.sinceReport = 0;
    this.port.onmessage = (event) => {
      if (event.data === "clear") {
        this.queue = [];
        this.offset = 0;
        this.report(true);
      } else {
        this.queue.push(event.data);
        this.received += event.data.length;
      }
    };
  }
  report(cleared = false) {
    const queued = this.queued();
    this.port.postMessage({ received: this.received, played: this.played, queued, cleared });
    this.sinceReport = 0;
  }
  queued() {
    return this.queue.reduce((n, chunk) => n + chunk.length, 0) - this.offset;
  }
  process(_inputs, outputs) {
    const out = outputs[0][0];
    let i = 0;
    while (i < out.length && this.queue.length) {
      const chunk = this.queue[0];
      const n = Math.min(out.length - i, chunk.length - this.offset);
      out.set(chunk.subarray(this.offset, this.offset + n), i);
      i += n;
      this.offset += n;
      this.played += n;
      if (this.offset === chunk.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    out.fill(0, i);
    this.sinceReport += out.length;
    if (this.sinceReport >= 2400) this.report();
    return true;
  }
}

registerProcessor("capture", Capture);
registerProcessor("player", Player);
