// Bundles src/ into one self-contained HTML file and writes it gzip-compressed to
// prebuilt/index.html.gz (run by scripts/build-webui.sh). The output depends only on the
// sources and the locked packages: no timestamps, gzip with a zero mtime.
import { build } from 'esbuild';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { gzipSync, constants } from 'node:zlib';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));
const bundle = async (entry) => {
  const r = await build({
    entryPoints: [here + entry],
    bundle: true,
    minify: true,
    write: false,
    format: 'esm',
    target: ['chrome111', 'firefox111', 'safari16'],
    jsx: 'automatic',
    jsxImportSource: 'preact',
    legalComments: 'none',
    charset: 'utf8',
  });
  return r.outputFiles[0].text.trim();
};

const script = (await bundle('src/app.jsx')).replaceAll('</script', '<\\/script');
const style = await bundle('src/style.css');
const hash = createHash('sha256').update(script).digest('base64');
// The page talks to its own server only; model text can never run script (markdown.js), and
// this policy would stop it if it did.
const csp = [
  "default-src 'none'",
  `script-src 'sha256-${hash}'`,
  "style-src 'unsafe-inline'",
  "img-src 'self' data: blob:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
].join('; ');
const html = readFileSync(here + 'src/index.html', 'utf8')
  .replace('%CSP%', csp)
  .replace('%STYLE%', () => style)
  .replace('%SCRIPT%', () => script);
mkdirSync(here + 'prebuilt', { recursive: true });
const gz = gzipSync(Buffer.from(html, 'utf8'), { level: constants.Z_BEST_COMPRESSION });
writeFileSync(here + 'prebuilt/index.html.gz', gz);
console.log(`webui: prebuilt/index.html.gz ${gz.length} bytes (${html.length} bytes of HTML)`);
