// FNV-1a over the int16 little-endian bytes of float samples: the page and the worklet hash what they
// received and what they rendered with this one function, so tests can compare them bit for bit.

export function fnv1aInt16(hash, samples, from, to) {
  let h = hash >>> 0;
  for (let i = from; i < to; i++) {
    let v = Math.round(samples[i] * 32768);
    v = v > 32767 ? 32767 : v < -32768 ? -32768 : v;
    const u = v & 0xffff;
    h = Math.imul(h ^ (u & 0xff), 0x01000193) >>> 0;
    h = Math.imul(h ^ (u >>> 8), 0x01000193) >>> 0;
  }
  return h;
}
