/**
 * Draw one context's timeline on a canvas: audio received (solid line) and audio played (dashed
 * line) in seconds of audio against wall time since the request started, a tick per chunk
 * arrival, and a labelled marker at the first heard sample. Line styles and labels, not colour
 * alone, tell the series apart. The gap between the two lines is the buffer.
 */

import { SAMPLE_RATE } from './live-client.js';

const PAD = { left: 44, right: 10, top: 10, bottom: 26 };

/**
 * @param {HTMLCanvasElement} canvas
 * @param {{arrivals: {t: number, samples: number, total: number}[], played: {t: number, samples: number}[],
 *          ttfaMs: number|null, nowMs: number}|null} ctxState  times in ms since the request started
 */
export function drawTimeline(canvas, ctxState) {
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 600;
  const height = canvas.clientHeight || 160;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
  }
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  const style = getComputedStyle(canvas);
  const fg = style.getPropertyValue('--fg').trim() || '#222';
  const accent = style.getPropertyValue('--accent').trim() || '#1a5fb4';
  const muted = style.getPropertyValue('--muted').trim() || '#777';
  g.clearRect(0, 0, width, height);
  g.font = '11px system-ui, sans-serif';
  g.fillStyle = muted;
  g.strokeStyle = muted;
  g.lineWidth = 1;

  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  g.strokeRect(PAD.left, PAD.top, plotW, plotH);
  if (!ctxState || ctxState.arrivals.length === 0) {
    g.fillText('no audio yet', PAD.left + 8, PAD.top + 16);
    return;
  }

  const lastArrival = ctxState.arrivals[ctxState.arrivals.length - 1];
  const maxT = Math.max(500, ctxState.nowMs, lastArrival.t) * 1.05;
  const maxAudio = Math.max(0.5, lastArrival.total / SAMPLE_RATE) * 1.1;
  const x = (t) => PAD.left + (t / maxT) * plotW;
  const y = (seconds) => PAD.top + plotH - (seconds / maxAudio) * plotH;

  // Axes labels: wall time (ms) along x, audio (s) along y.
  g.fillText('0', PAD.left - 10, height - PAD.bottom + 14);
  g.fillText(`${Math.round(maxT)} ms since request`, width - PAD.right - 130, height - PAD.bottom + 14);
  g.fillText(`${maxAudio.toFixed(1)} s`, 4, PAD.top + 10);
  g.fillText('audio', 4, PAD.top + 24);

  // One tick per chunk arrival along the bottom edge.
  g.strokeStyle = fg;
  for (const a of ctxState.arrivals) {
    g.beginPath();
    g.moveTo(x(a.t), PAD.top + plotH);
    g.lineTo(x(a.t), PAD.top + plotH - 6);
    g.stroke();
  }

  // Received audio: solid step line.
  g.strokeStyle = accent;
  g.lineWidth = 2;
  g.setLineDash([]);
  g.beginPath();
  g.moveTo(x(ctxState.arrivals[0].t), y(0));
  for (const a of ctxState.arrivals) {
    g.lineTo(x(a.t), y((a.total - a.samples) / SAMPLE_RATE));
    g.lineTo(x(a.t), y(a.total / SAMPLE_RATE));
  }
  g.lineTo(x(ctxState.nowMs), y(lastArrival.total / SAMPLE_RATE));
  g.stroke();

  // Played audio: dashed line.
  if (ctxState.played.length > 0) {
    g.strokeStyle = fg;
    g.setLineDash([5, 4]);
    g.beginPath();
    ctxState.played.forEach((p, i) => {
      if (i === 0) g.moveTo(x(p.t), y(p.samples / SAMPLE_RATE));
      else g.lineTo(x(p.t), y(p.samples / SAMPLE_RATE));
    });
    g.stroke();
    g.setLineDash([]);
  }

  // First heard sample.
  if (ctxState.ttfaMs !== null) {
    g.strokeStyle = fg;
    g.lineWidth = 1;
    g.setLineDash([2, 2]);
    g.beginPath();
    g.moveTo(x(ctxState.ttfaMs), PAD.top);
    g.lineTo(x(ctxState.ttfaMs), PAD.top + plotH);
    g.stroke();
    g.setLineDash([]);
    g.fillStyle = fg;
    g.fillText(`heard at ${Math.round(ctxState.ttfaMs)} ms`, Math.min(x(ctxState.ttfaMs) + 4, width - 110), PAD.top + 12);
  }
}
