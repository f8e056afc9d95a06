// njs handler for the benchmark's instant upstream (see upstream.py).
// Only picks a precomputed body; never parses JSON. ">64 KB of request" means the
// 2,048-input batch, and "encoding_format":"base64" anywhere means base64 vectors.
// On the native port (embeddings_cut), "dimensions":256 anywhere means the vectors
// cut to 256 and re-normalised, as an upstream started Matryoshka answers.
// - The 8-vector bodies come from `js_preload_object bodies from bodies-8.json;`:
//   parsed once when nginx loads its configuration, shared read-only by requests
//   (an njs module's top-level code runs again for every request, so no file
//   reading there).
// - The 2,048-vector bodies (26 MB / 11 MB) are files sent by nginx's static module
//   after an internal redirect; preloading them made every request ~0.6 s slower.
var BIG_REQUEST_BYTES = 65536;
var BASE64 = /"encoding_format"\s*:\s*"base64"/;
var CUT = /"dimensions"\s*:\s*256(?![0-9])/;

function answer(r, cuts) {
    var request = r.requestText || '';
    var encoding = BASE64.test(request) ? 'base64' : 'float';
    var suffix = cuts && CUT.test(request) ? '-d256' : '';
    if (request.length > BIG_REQUEST_BYTES) {
        r.internalRedirect('/_bodies/' + encoding + '-2048' + suffix + '.json');
        return;
    }
    r.headersOut['Content-Type'] = 'application/json';
    r.return(200, bodies[encoding + '-8' + suffix]);
}

function embeddings(r) {
    answer(r, false);
}

function embeddings_cut(r) {
    answer(r, true);
}

export default {embeddings, embeddings_cut};
