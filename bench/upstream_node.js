// Fallback instant upstream (Node.js http) when nginx + njs are not installed; see
// upstream.py. Same rule as upstream_njs.js: the bodies are read once at start; a
// request over 64 KB gets the 2,048-input body, "encoding_format":"base64" base64.
'use strict';
const fs = require('fs');
const http = require('http');
const [dir, port] = process.argv.slice(2);
const BIG_REQUEST_BYTES = 65536;
const bodies = {};
for (const name of ['float-8', 'base64-8', 'float-2048', 'base64-2048']) {
  const path = `${dir}/${name}.json`;
  if (fs.existsSync(path)) bodies[name] = fs.readFileSync(path);  // 2,048: only if written
}
const BASE64 = /"encoding_format"\s*:\s*"base64"/;
const server = http.createServer((req, res) => {
  const chunks = [];
  let size = 0;
  req.on('data', (chunk) => { chunks.push(chunk); size += chunk.length; });
  req.on('end', () => {
    if (req.url !== '/v1/embeddings') {
      res.writeHead(404, {'content-length': 0});
      res.end();
      return;
    }
    const text = Buffer.concat(chunks, size).toString('latin1');
    const key = (BASE64.test(text) ? 'base64' : 'float') + '-' + (size > BIG_REQUEST_BYTES ? '2048' : '8');
    const body = bodies[key];
    if (body === undefined) {
      res.writeHead(501, {'content-type': 'text/plain'});
      res.end(`no ${key} body was written`);
      return;
    }
    res.writeHead(200, {'content-type': 'application/json', 'content-length': body.length});
    res.end(body);
  });
});
server.keepAliveTimeout = 300000;
server.headersTimeout = 301000;
server.listen(Number(port), '127.0.0.1');
process.on('SIGTERM', () => server.close(() => process.exit(0)));
