// Fallback instant upstream (Node.js http) when nginx + njs are not installed; see
// upstream.py. Same rule as upstream_njs.js: the bodies are read once at start; a
// request over 64 KB gets the 2,048-input body, "encoding_format":"base64" base64;
// on the optional native port, "dimensions":256 the vectors cut to 256.
'use strict';
const fs = require('fs');
const http = require('http');
const [dir, port, nativePort] = process.argv.slice(2);
const BIG_REQUEST_BYTES = 65536;
const bodies = {};
for (const size of ['8', '2048']) {
  for (const encoding of ['float', 'base64']) {
    for (const suffix of ['', '-d256']) {
      const name = `${encoding}-${size}${suffix}`;
      const path = `${dir}/${name}.json`;
      if (fs.existsSync(path)) bodies[name] = fs.readFileSync(path);  // 2,048: only if written
    }
  }
}
const BASE64 = /"encoding_format"\s*:\s*"base64"/;
const CUT = /"dimensions"\s*:\s*256(?![0-9])/;
const servers = [];
function serve(listenPort, cuts) {
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
      const key = (BASE64.test(text) ? 'base64' : 'float') + '-' +
        (size > BIG_REQUEST_BYTES ? '2048' : '8') + (cuts && CUT.test(text) ? '-d256' : '');
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
  server.listen(Number(listenPort), '127.0.0.1');
  servers.push(server);
}
serve(port, false);
if (nativePort) serve(nativePort, true);
process.on('SIGTERM', () => {
  let open = servers.length;
  for (const server of servers) server.close(() => { if (--open === 0) process.exit(0); });
});
