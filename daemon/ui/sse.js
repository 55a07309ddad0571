// Server-sent events read from a fetch() body: frames split on blank lines, only data: lines
// matter (one leading space stripped, several joined with "\n"); id:, event:, retry: and
// comments are ignored because the JSON envelope carries the id. Pure.

export const MAX_BUFFER_CHARS = 16 * 1024 * 1024;

export class SseParser {
  constructor() {
    this.buffer = "";
  }

  // Feed decoded text; returns the data payloads of every complete frame.
  feed(text) {
    this.buffer = (this.buffer + text).replace(/\r\n/g, "\n");
    const out = [];
    let end = this.buffer.indexOf("\n\n");
    while (end !== -1) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      }
      if (data.length) out.push(data.join("\n"));
      end = this.buffer.indexOf("\n\n");
    }
    if (this.buffer.length > MAX_BUFFER_CHARS) throw new Error("SSE frame larger than 16 MiB");
    return out;
  }
}
