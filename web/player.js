/**
 * Main-thread side of the player: owns the 24 kHz AudioContext and the jitter-buffer worklet,
 * forwards audio to it, and turns the worklet's sample counters into times the page can show
 * (when a sample was heard) and report (how many samples were played and heard).
 *
 * The AudioContext runs at the stream rate (24 kHz) and the browser resamples to the device, so
 * the worklet's counters are in the protocol's sample units with no conversion.
 */

import { SAMPLE_RATE } from './live-client.js';

export class Player {
  /** @param {{onTrackEvent: (msg: object) => void, onState: (msg: object) => void}} handlers */
  constructor(handlers) {
    this.handlers = handlers;
    this.context = null;
    this.node = null;
    this.stopWaiters = new Map(); // id -> resolve(track snapshot) for pending stops
    this.lastState = { frame: 0, tracks: [], peakSinceStop: 0 };
  }

  get ready() {
    return this.node !== null;
  }

  /** Create (or resume) the audio graph; call from a click so autoplay rules allow sound. */
  async start({ targetMs = 60, maxTargetMs = 300, record = false } = {}) {
    if (this.context) {
      if (this.context.state === 'suspended') await this.context.resume();
      return;
    }
    if (typeof AudioWorkletNode === 'undefined') {
      throw new Error('this page needs AudioWorklet, which browsers give only to secure pages: open it via localhost or https');
    }
    this.context = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: 'interactive' });
    await this.context.audioWorklet.addModule(new URL('./player-worklet.js', import.meta.url));
    this.node = new AudioWorkletNode(this.context, 'vivace-jitter-player', {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
    });
    this.node.port.onmessage = (ev) => this.onWorkletMessage(ev.data);
    this.node.port.postMessage({ type: 'config', targetMs, maxTargetMs, record });
    this.node.connect(this.context.destination);
    if (this.context.state === 'suspended') await this.context.resume();
  }

  onWorkletMessage(msg) {
    if (msg.type === 'state') {
      this.lastState = msg;
      this.handlers.onState(msg);
      return;
    }
    if (msg.type === 'stopped') {
      const resolve = this.stopWaiters.get(msg.id);
      this.stopWaiters.delete(msg.id);
      resolve?.(msg.track);
    }
    this.handlers.onTrackEvent(msg);
  }

  push(id, samples) {
    this.node.port.postMessage({ type: 'push', id, samples }, [samples.buffer]);
  }

  end(id, total) {
    this.node.port.postMessage({ type: 'end', id, total });
  }

  /** Barge-in: silence `id` from the next render quantum on; resolves with its final counters. */
  stop(id) {
    return new Promise((resolve) => {
      this.stopWaiters.set(id, resolve);
      this.node.port.postMessage({ type: 'stop', id });
    });
  }

  /**
   * Seconds between a sample being rendered (the context's currentTime) and being heard.
   * getOutputTimestamp() pairs the context time at the speaker with the performance time it was
   * heard; advanced to now, its distance to currentTime is the output path's latency. Where that
   * is missing or implausible (seen right after a context starts), fall back to the latencies the
   * context declares.
   */
  outputLatencySeconds() {
    const ctx = this.context;
    if (!ctx) return 0;
    const ts = ctx.getOutputTimestamp ? ctx.getOutputTimestamp() : null;
    if (ts && ts.performanceTime > 0) {
      const heardNow = ts.contextTime + (performance.now() - ts.performanceTime) / 1000;
      const latency = ctx.currentTime - heardNow;
      if (latency >= 0 && latency < 1) return latency;
    }
    return (ctx.outputLatency || 0) + (ctx.baseLatency || 0);
  }

  /**
   * performance.now() at which the sample rendered at context frame `frame` reaches the listener:
   * both clocks are read now (currentTime on the main thread moves once per 128-sample quantum).
   */
  heardAtMs(frame) {
    const ctx = this.context;
    return performance.now() + (frame / ctx.sampleRate - ctx.currentTime + this.outputLatencySeconds()) * 1000;
  }

  /** Samples rendered but not yet heard: the output path's latency in samples. */
  latencySamples() {
    return this.context ? Math.round(this.outputLatencySeconds() * this.context.sampleRate) : 0;
  }
}
