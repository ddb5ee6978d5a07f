/**
 * Decode one context's bare Opus packets (one per binary frame) into 24 kHz Float32 samples on the
 * context's timeline, with WebCodecs `AudioDecoder`.
 *
 * The server encodes 24 kHz PCM; the browser's Opus decoder always outputs 48 kHz (measured in
 * Chromium: `sampleRate: 24000` in the config is accepted and ignored). The encoder's input had
 * nothing above 12 kHz, so keeping every second 48 kHz sample (the even ones) returns the 24 kHz
 * signal without a filter: measured against libopus decoding the same packets at 24 kHz, white
 * noise correlates at 0.99999999 (the odd samples, half a sample late, only at 0.55). The first `pre_skip` decoded samples (24 kHz units, from `context.created`) are the
 * encoder's lookahead and are dropped, so sample k of the output is sample k of the timeline; the
 * tail past `context.done.samples` is the final padding packet and is clipped by the player.
 */

import { SAMPLE_RATE } from './live-client.js';

const DECODER_RATE = 48000;

/** True when this browser can decode Opus with WebCodecs (secure contexts only). */
export async function opusSupported() {
  if (typeof AudioDecoder === 'undefined') return false;
  try {
    const r = await AudioDecoder.isConfigSupported({ codec: 'opus', sampleRate: DECODER_RATE, numberOfChannels: 1 });
    return Boolean(r.supported);
  } catch {
    return false;
  }
}

export class OpusStream {
  /**
   * @param {number} preSkip samples (24 kHz) to drop from the start of the decoded stream
   * @param {(samples: Float32Array) => void} onSamples called in timeline order
   * @param {(error: Error) => void} onError
   */
  constructor(preSkip, onSamples, onError) {
    this.toSkip = preSkip;
    this.onSamples = onSamples;
    this.packets = 0;
    this.decoder = new AudioDecoder({
      output: (data) => this.output(data),
      error: (e) => onError(e instanceof Error ? e : new Error(String(e))),
    });
    this.decoder.configure({ codec: 'opus', sampleRate: DECODER_RATE, numberOfChannels: 1 });
  }

  decode(packet, startSample) {
    // Timestamps only need to increase; the start sample on the 24 kHz timeline gives that.
    const timestamp = Math.round((startSample * 1e6) / SAMPLE_RATE);
    this.decoder.decode(new EncodedAudioChunk({ type: 'key', timestamp, data: packet }));
    this.packets += 1;
  }

  output(data) {
    const frames = data.numberOfFrames;
    const decoded = new Float32Array(frames);
    data.copyTo(decoded, { planeIndex: 0, format: 'f32-planar' });
    const ratio = Math.round(data.sampleRate / SAMPLE_RATE);
    data.close();
    let samples = decoded;
    if (ratio > 1) {
      samples = new Float32Array(Math.floor(frames / ratio));
      for (let i = 0; i < samples.length; i++) samples[i] = decoded[i * ratio];
    }
    if (this.toSkip > 0) {
      const skip = Math.min(this.toSkip, samples.length);
      this.toSkip -= skip;
      samples = samples.subarray(skip);
    }
    if (samples.length > 0) this.onSamples(samples);
  }

  /** Resolves once every packet given so far has been decoded and delivered. */
  async flush() {
    if (this.decoder.state === 'configured') await this.decoder.flush();
  }

  close() {
    if (this.decoder.state !== 'closed') this.decoder.close();
  }
}
