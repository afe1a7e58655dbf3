// The chat page. One component tree; state lives in App and is saved to localStorage on
// every change (store.js). Replies stream from /v1/chat/completions (api.js) and are
// rendered as sanitized markdown (markdown.js).
import { render } from 'preact';
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { ApiError, fetchModels, streamChat } from './api.js';
import { renderMarkdown } from './markdown.js';
import { exportJson, getItem, importJson, loadConversations, newConversation, saveConversations, setItem } from './store.js';

const SAMPLING = [
  // [field, label, parse, bounds text]
  ['temperature', 'Temperature', parseFloat, '0 to 2'],
  ['top_p', 'Top-p', parseFloat, '0 to 1'],
  ['top_k', 'Top-k', (s) => Number(s), 'whole number, 0 = off'],
  ['min_p', 'Min-p', parseFloat, '0 to 1'],
  ['max_tokens', 'Max tokens', (s) => Number(s), 'whole number'],
  ['seed', 'Seed', (s) => Number(s), 'whole number'],
];
const INTEGER_FIELDS = new Set(['top_k', 'max_tokens', 'seed']);

// The request fields of a conversation's settings; throws naming a field that is not a number.
function samplingFields(settings) {
  const out = {};
  for (const [field, label, parse] of SAMPLING) {
    const raw = String(settings[field] ?? '').trim();
    if (raw === '') continue;
    const v = parse(raw);
    if (!Number.isFinite(v) || (INTEGER_FIELDS.has(field) && !Number.isInteger(v)))
      throw new Error(`${label} must be ${INTEGER_FIELDS.has(field) ? 'a whole number' : 'a number'}, not "${raw}"`);
    out[field] = v;
  }
  return out;
}

function initialTheme() {
  const saved = getItem('theme');
  if (saved === 'light' || saved === 'dark') return saved;
  return window.matchMedia && window.matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  // Pages served over plain http from another host have no Clipboard API.
  const area = document.createElement('textarea');
  area.value = text;
  area.setAttribute('readonly', '');
  area.style.position = 'fixed';
  area.style.opacity = '0';
  document.body.appendChild(area);
  area.select();
  const ok = document.execCommand('copy');
  area.remove();
  if (!ok) throw new Error('the browser refused to copy');
}

// A ref that focuses its element when it appears (the autofocus attribute works only once a page).
function useFocusRef() {
  const ref = useRef(null);
  useEffect(() => { if (ref.current) ref.current.focus(); }, []);
  return ref;
}

function Stats({ stats }) {
  if (!stats) return null;
  const parts = [];
  if (stats.completion_tokens != null) parts.push(`${stats.completion_tokens} tokens`);
  if (stats.tokens_per_second != null) parts.push(`${stats.tokens_per_second.toFixed(1)} tokens/s`);
  if (stats.ttft_ms != null) parts.push(`first token ${Math.round(stats.ttft_ms)} ms`);
  if (stats.finish_reason) parts.push(`finish: ${stats.finish_reason}`);
  return <div class="stats" data-testid="stats">{parts.join(' · ')}</div>;
}

function EditBox({ value, setValue, onSave, onCancel }) {
  const ref = useFocusRef();
  return (
    <textarea ref={ref} aria-label="Edit message" value={value} onInput={(e) => setValue(e.currentTarget.value)}
      onKeyDown={(e) => {
        if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); onSave(); }
        if (e.key === 'Escape') onCancel();
      }} />
  );
}

function RenameBox({ value, setValue, done }) {
  const ref = useFocusRef();
  return (
    <input ref={ref} aria-label="Conversation name" value={value} onInput={(e) => setValue(e.currentTarget.value)}
      onKeyDown={(e) => { if (e.key === 'Enter') done(true); if (e.key === 'Escape') done(false); }}
      onBlur={() => done(true)} />
  );
}

function ConfirmDelete({ title, onDelete, onCancel }) {
  const ref = useFocusRef();
  return <button ref={ref} class="icon danger" aria-label={`Really delete ${title}`} onClick={onDelete} onBlur={onCancel}>Delete?</button>;
}

function Message({ message, index, busy, isLast, onEdit, onRegenerate }) {
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState(message.content);
  const [copied, setCopied] = useState('');
  const html = useMemo(() => (message.role === 'assistant' ? renderMarkdown(message.content) : ''), [message.content, message.role]);

  const copy = () => copyText(message.content).then(() => setCopied('Copied'), (e) => setCopied(`Copy failed: ${e.message}`));
  useEffect(() => {
    if (!copied) return undefined;
    const t = setTimeout(() => setCopied(''), 1500);
    return () => clearTimeout(t);
  }, [copied]);

  if (editing) {
    const save = () => {
      setEditing(false);
      onEdit(index, draft);
    };
    return (
      <div class="msg user editing" data-role="user">
        <EditBox value={draft} setValue={setDraft} onSave={save} onCancel={() => setEditing(false)} />
        <div class="actions">
          <button onClick={save} disabled={busy || !draft.trim()}>Save &amp; send</button>
          <button onClick={() => setEditing(false)}>Cancel</button>
        </div>
      </div>
    );
  }
  return (
    <div class={`msg ${message.role}${message.error ? ' has-error' : ''}`} data-role={message.role}>
      {message.images && message.images.length > 0 && (
        <div class="images" data-testid="message-images">
          {message.images.map((url, i) => <img key={i} src={url} alt={`Attached image ${i + 1}`} />)}
        </div>
      )}
      {message.role === 'user'
        ? <div class="content user-text">{message.content}</div>
        : <div class="content markdown" dangerouslySetInnerHTML={{ __html: html }} />}
      {message.pending && !message.content && <div class="typing" aria-label="Waiting for the reply">…</div>}
      {message.error && <div class="error" role="alert" data-testid="error">{message.error}</div>}
      {message.stopped && <div class="stopped" data-testid="stopped">Stopped</div>}
      {!message.pending && <Stats stats={message.stats} />}
      {!message.pending && (
        <div class="actions">
          <button onClick={copy} aria-label="Copy message">{copied || 'Copy'}</button>
          {message.role === 'user' && (
            <button onClick={() => { setDraft(message.content); setEditing(true); }} disabled={busy} aria-label="Edit and resend">Edit</button>
          )}
          {message.role === 'assistant' && isLast && (
            <button onClick={onRegenerate} disabled={busy} aria-label="Regenerate reply">Regenerate</button>
          )}
        </div>
      )}
    </div>
  );
}

function ConversationItem({ conv, active, onSelect, onRename, onDelete }) {
  const [renaming, setRenaming] = useState(false);
  const [title, setTitle] = useState(conv.title);
  const [confirming, setConfirming] = useState(false);
  if (renaming) {
    const done = (save) => {
      setRenaming(false);
      if (save && title.trim()) onRename(title.trim());
    };
    return (
      <li class="conv active">
        <RenameBox value={title} setValue={setTitle} done={done} />
      </li>
    );
  }
  return (
    <li class={`conv${active ? ' active' : ''}`}>
      <button class="conv-title" onClick={onSelect} aria-current={active ? 'true' : undefined} title={conv.title}>{conv.title}</button>
      <button class="icon" aria-label={`Rename ${conv.title}`} onClick={() => { setTitle(conv.title); setRenaming(true); }}>✎</button>
      {confirming
        ? <ConfirmDelete title={conv.title} onDelete={onDelete} onCancel={() => setConfirming(false)} />
        : <button class="icon" aria-label={`Delete ${conv.title}`} onClick={() => setConfirming(true)}>✕</button>}
    </li>
  );
}

function Settings({ settings, onChange, apiKey, onApiKey, onClose }) {
  const set = (field) => (e) => onChange({ ...settings, [field]: e.currentTarget.value });
  return (
    <aside class="settings" aria-label="Settings">
      <div class="settings-head">
        <h2>Settings</h2>
        <button class="icon" onClick={onClose} aria-label="Close settings">✕</button>
      </div>
      <label>System prompt
        <textarea rows="4" value={settings.system} onInput={set('system')} placeholder="(none)" />
      </label>
      <div class="grid">
        {SAMPLING.map(([field, label, , hint]) => (
          <label key={field}>{label}
            <input name={field} inputMode="decimal" value={settings[field]} onInput={set(field)} placeholder="server default" title={hint} />
          </label>
        ))}
      </div>
      <p class="hint">Empty fields use the server's defaults. These settings belong to this conversation.</p>
      <label>API key
        <input type="password" name="api-key" autocomplete="off" value={apiKey} onInput={(e) => onApiKey(e.currentTarget.value)}
          placeholder="only when the server was started with --api-key" />
      </label>
    </aside>
  );
}

// The image types the server decodes (docs/server.md, "Images"), and its limit per image.
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/webp', 'image/gif'];
const MAX_IMAGE_BYTES = 20 * 1024 * 1024;

// A file as a data: URL (what an image_url part carries).
function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error || new Error('the browser could not read it'));
    reader.readAsDataURL(file);
  });
}

// A message as the API takes it: with images, a list of image_url parts before the text.
function apiMessage({ role, content, images }) {
  if (!images || !images.length) return { role, content };
  return { role, content: [...images.map((url) => ({ type: 'image_url', image_url: { url } })), { type: 'text', text: content }] };
}

// The page's state and actions. Long because it is the one owner of the state every part
// shares (the conversations, the request in flight, the theme and key): the actions below
// change one list, which is saved whole; the components above only draw.
function App() {
  const [convs, setConvs] = useState(() => {
    const list = loadConversations();
    return list.length ? list : [newConversation()];
  });
  const [currentId, setCurrentId] = useState(() => {
    const saved = getItem('current');
    return convs.some((c) => c.id === saved) ? saved : convs[0].id;
  });
  const [theme, setTheme] = useState(() => {
    const t = initialTheme();
    document.documentElement.dataset.theme = t;  // before the first paint
    return t;
  });
  const [apiKey, setApiKey] = useState(() => getItem('apiKey'));
  const [model, setModel] = useState('');
  const [takesImages, setTakesImages] = useState(false);  // the model reads images (/v1/models)
  const [attached, setAttached] = useState([]);  // data: URLs for the next message
  const [banner, setBanner] = useState('');
  const [input, setInput] = useState('');
  const [busy, setBusy] = useState(false);
  const [showSettings, setShowSettings] = useState(false);
  const [showList, setShowList] = useState(false);
  const controller = useRef(null);
  const messagesEnd = useRef(null);
  const importer = useRef(null);
  const imagePicker = useRef(null);
  const composer = useRef(null);

  const conv = convs.find((c) => c.id === currentId) || convs[0];

  useEffect(() => {
    try {
      saveConversations(convs);
    } catch (e) {
      setBanner(`Cannot save the conversations in this browser: ${e.message}`);
    }
  }, [convs]);
  useEffect(() => setItem('current', conv.id), [conv.id]);
  useEffect(() => setItem('apiKey', apiKey), [apiKey]);
  useEffect(() => { document.documentElement.dataset.theme = theme; }, [theme]);
  // Saved at once, not in an effect, so that a reload right after the click keeps it.
  const switchTheme = () => {
    const next = theme === 'dark' ? 'light' : 'dark';
    setItem('theme', next);
    document.documentElement.dataset.theme = next;
    setTheme(next);
  };
  useEffect(() => {
    let live = true;
    fetchModels(apiKey).then(
      (models) => {
        if (!live) return;
        setModel(models.length ? models[0].id : '');
        setTakesImages(models.length > 0 && models[0].images);
        setBanner(models.length ? '' : 'The server lists no model.');
      },
      (e) => { if (live) { setModel(''); setTakesImages(false); setBanner(`Cannot list the models: ${e.message}`); } });
    return () => { live = false; };
  }, [apiKey]);
  useEffect(() => {
    const el = messagesEnd.current;
    if (el && el.scrollIntoView) el.scrollIntoView({ block: 'end' });
  }, [conv.messages]);

  const updateConv = (id, fn) => setConvs((list) => list.map((c) => (c.id === id ? { ...fn(c), updated: Date.now() } : c)));
  const updateLast = (id, fn) => updateConv(id, (c) => {
    const messages = c.messages.slice();
    messages[messages.length - 1] = fn(messages[messages.length - 1]);
    return { ...c, messages };
  });

  // Asks for a reply to `messages` (which end with a user turn) in conversation `target`.
  async function generate(target, messages) {
    const id = target.id;
    updateConv(id, (c) => ({ ...c, messages: [...messages, { role: 'assistant', content: '', pending: true }] }));
    let fields;
    try {
      fields = samplingFields(target.settings);
    } catch (e) {
      updateLast(id, (m) => ({ ...m, pending: false, error: e.message }));
      return;
    }
    const history = messages.filter((m) => !(m.role === 'assistant' && m.error && !m.content))
      .map(apiMessage);
    if (target.settings.system.trim()) history.unshift({ role: 'system', content: target.settings.system });
    const body = { messages: history, ...fields };
    if (model) body.model = model;
    const ctl = new AbortController();
    controller.current = ctl;
    setBusy(true);
    const t0 = performance.now();
    let tFirst = null;
    let text = '';
    let timer = 0;
    const flush = () => {
      timer = 0;
      const now = text;
      updateLast(id, (m) => ({ ...m, content: now }));
    };
    try {
      const { usage, finishReason } = await streamChat({
        body, apiKey, signal: ctl.signal,
        onDelta: (piece) => {
          if (tFirst === null) tFirst = performance.now();
          text += piece;
          // A timer, not requestAnimationFrame, which hidden pages do not run.
          if (!timer) timer = setTimeout(flush, 30);
        },
      });
      const tEnd = performance.now();
      const n = usage ? usage.completion_tokens : null;
      const stats = {
        completion_tokens: n,
        ttft_ms: tFirst === null ? null : tFirst - t0,
        tokens_per_second: n > 1 && tFirst !== null && tEnd > tFirst ? (n - 1) / ((tEnd - tFirst) / 1000) : null,
        finish_reason: finishReason,
      };
      updateLast(id, (m) => ({ ...m, content: text, pending: false, stats }));
    } catch (e) {
      const stopped = e.name === 'AbortError';
      const message = stopped ? null : e instanceof ApiError ? e.message : `The request failed: ${e.message}`;
      updateLast(id, (m) => ({ ...m, content: text, pending: false, stopped, error: message,
        stats: tFirst === null ? null : { ttft_ms: tFirst - t0 } }));
    } finally {
      if (timer) clearTimeout(timer);
      controller.current = null;
      setBusy(false);
    }
  }

  function send() {
    const text = input.trim();
    if (!text || busy) return;
    setInput('');
    const images = attached;
    setAttached([]);
    const title = conv.messages.length === 0 && conv.title === 'New chat' ? text.slice(0, 40) : conv.title;
    const target = { ...conv, title };
    updateConv(conv.id, (c) => ({ ...c, title }));
    generate(target, [...conv.messages, images.length ? { role: 'user', content: text, images } : { role: 'user', content: text }]);
  }

  // Attaches the chosen image files to the next message; a file the server would refuse is named.
  async function attachImages(e) {
    const files = Array.from(e.currentTarget.files || []);
    e.currentTarget.value = '';
    const urls = [];
    for (const file of files) {
      if (!IMAGE_TYPES.includes(file.type)) {
        setBanner(`Cannot attach ${file.name}: images are PNG, JPEG, WebP or GIF`);
        return;
      }
      if (file.size > MAX_IMAGE_BYTES) {
        setBanner(`Cannot attach ${file.name}: ${file.size} bytes, past the server's 20 MiB per image`);
        return;
      }
      try {
        urls.push(await readDataUrl(file));
      } catch (err) {
        setBanner(`Cannot read ${file.name}: ${err.message}`);
        return;
      }
    }
    setAttached((list) => [...list, ...urls]);
  }

  const stop = () => controller.current && controller.current.abort();

  function regenerate() {
    if (busy) return;
    const messages = conv.messages.slice();
    while (messages.length && messages[messages.length - 1].role === 'assistant') messages.pop();
    if (messages.length) generate(conv, messages);
  }

  function editAndResend(index, text) {
    if (busy || !text.trim()) return;
    const messages = conv.messages.slice(0, index);
    const { images } = conv.messages[index];
    messages.push(images && images.length ? { role: 'user', content: text.trim(), images } : { role: 'user', content: text.trim() });
    generate(conv, messages);
  }

  function addConversation() {
    const c = newConversation();
    setConvs((list) => [c, ...list]);
    setCurrentId(c.id);
    setShowList(false);
    if (composer.current) composer.current.focus();
  }

  function deleteConversation(id) {
    if (busy && id === conv.id) stop();
    const rest = convs.filter((c) => c.id !== id);
    const list = rest.length ? rest : [newConversation()];
    setConvs(list);
    if (id === currentId) setCurrentId(list[0].id);
  }

  function exportAll() {
    const blob = new Blob([exportJson(convs)], { type: 'application/json' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    a.download = 'osprey-conversations.json';
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 0);
  }

  async function importFile(e) {
    const file = e.currentTarget.files && e.currentTarget.files[0];
    e.currentTarget.value = '';
    if (!file) return;
    try {
      const imported = importJson(await file.text());
      setConvs((list) => [...imported, ...list]);
      if (imported.length) setCurrentId(imported[0].id);
      setBanner('');
    } catch (err) {
      setBanner(`Cannot import ${file.name}: ${err.message}`);
    }
  }

  const sorted = [...convs].sort((a, b) => b.updated - a.updated);
  const last = conv.messages[conv.messages.length - 1];

  return (
    <div class={`app${showList ? ' list-open' : ''}`} onKeyDown={(e) => {
      if (e.key !== 'Escape') return;
      if (busy) stop();
      setShowList(false);
    }}>
      <nav class="sidebar" aria-label="Conversations">
        <div class="side-actions">
          <button class="primary" onClick={addConversation}>New chat</button>
          <button onClick={() => importer.current.click()}>Import</button>
          <button onClick={exportAll}>Export</button>
          <input ref={importer} type="file" accept="application/json,.json" hidden onChange={importFile} data-testid="import" />
          <button class="icon close-list" aria-label="Close the conversation list" onClick={() => setShowList(false)}>✕</button>
        </div>
        <ul class="convs">
          {sorted.map((c) => (
            <ConversationItem key={c.id} conv={c} active={c.id === conv.id}
              onSelect={() => { setCurrentId(c.id); setShowList(false); }}
              onRename={(title) => updateConv(c.id, (x) => ({ ...x, title }))}
              onDelete={() => deleteConversation(c.id)} />
          ))}
        </ul>
      </nav>
      <main class="main">
        <header class="top">
          <button class="icon menu" aria-label="Conversations" aria-expanded={showList} onClick={() => setShowList(!showList)}>☰</button>
          <h1 title={conv.title}>{conv.title}</h1>
          <span class="model" data-testid="model" title="The model, from /v1/models">{model || '—'}</span>
          <button class="icon" aria-label={theme === 'dark' ? 'Switch to the light theme' : 'Switch to the dark theme'}
            data-testid="theme" onClick={switchTheme}>{theme === 'dark' ? '☀' : '☾'}</button>
          <button class="icon" aria-label="Settings" aria-expanded={showSettings} onClick={() => setShowSettings(!showSettings)}>⚙</button>
        </header>
        {banner && (
          <div class="banner error" role="alert">
            <span data-testid="banner">{banner}</span>
            <button class="icon" aria-label="Dismiss the message" onClick={() => setBanner('')}>✕</button>
          </div>
        )}
        <section class="messages" aria-live="polite" aria-label="Messages">
          {conv.messages.length === 0 && <p class="empty">Ask {model || 'the model'} something.</p>}
          {conv.messages.map((m, i) => (
            <Message key={`${conv.id}-${i}`} message={m} index={i} busy={busy} isLast={m === last}
              onEdit={editAndResend} onRegenerate={regenerate} />
          ))}
          <div ref={messagesEnd} />
        </section>
        {attached.length > 0 && (
          <div class="attached" data-testid="attached">
            {attached.map((url, i) => (
              <span class="attachment" key={i}>
                <img src={url} alt={`Image ${i + 1} for the next message`} />
                <button type="button" class="icon" aria-label={`Remove image ${i + 1}`}
                  onClick={() => setAttached((list) => list.filter((_, k) => k !== i))}>✕</button>
              </span>
            ))}
          </div>
        )}
        <form class="composer" onSubmit={(e) => { e.preventDefault(); send(); }}>
          {takesImages && (
            <>
              <button type="button" class="attach" aria-label="Attach an image" title="Attach an image (PNG, JPEG, WebP, GIF)"
                data-testid="attach" disabled={busy} onClick={() => imagePicker.current.click()}>+ Image</button>
              <input ref={imagePicker} type="file" accept={IMAGE_TYPES.join(',')} multiple hidden onChange={attachImages}
                data-testid="attach-input" />
            </>
          )}
          <textarea ref={composer} aria-label="Message" placeholder="Message (Enter sends, Shift+Enter for a new line)" rows="2"
            value={input} onInput={(e) => setInput(e.currentTarget.value)}
            onKeyDown={(e) => { if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); } }} />
          {busy
            ? <button type="button" class="stop" onClick={stop} data-testid="stop">Stop</button>
            : <button type="submit" class="primary" disabled={!input.trim()} data-testid="send">Send</button>}
        </form>
      </main>
      {showList && <div class="scrim" onClick={() => setShowList(false)} />}
      {showSettings && (
        <Settings settings={conv.settings} onChange={(settings) => updateConv(conv.id, (c) => ({ ...c, settings }))}
          apiKey={apiKey} onApiKey={setApiKey} onClose={() => setShowSettings(false)} />
      )}
    </div>
  );
}

render(<App />, document.getElementById('app'));
