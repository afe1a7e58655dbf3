// Conversations, settings and the API key, kept in the browser's localStorage.
const KEY = 'osprey.conversations';

export const defaultSettings = () => ({
  system: '',
  temperature: '',
  top_p: '',
  top_k: '',
  min_p: '',
  max_tokens: '',
  seed: '',
});

export function newConversation() {
  const now = Date.now();
  return {
    id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`,
    title: 'New chat',
    created: now,
    updated: now,
    messages: [],
    settings: defaultSettings(),
  };
}

export function loadConversations() {
  try {
    const list = JSON.parse(localStorage.getItem(KEY) || '[]');
    return Array.isArray(list) ? list.filter(isConversation) : [];
  } catch {
    return [];
  }
}

export function saveConversations(list) {
  // A reply being written is stored as far as it has come.
  localStorage.setItem(KEY, JSON.stringify(list.map((c) => ({
    ...c,
    messages: c.messages.map(({ pending, ...m }) => m),
  }))));
}

export const getItem = (name, fallback = '') => localStorage.getItem(`osprey.${name}`) ?? fallback;
export const setItem = (name, value) => localStorage.setItem(`osprey.${name}`, value);

function isConversation(c) {
  return c && typeof c === 'object' && typeof c.id === 'string' && typeof c.title === 'string' &&
    Array.isArray(c.messages) && c.messages.every((m) => m && (m.role === 'user' || m.role === 'assistant') &&
      typeof m.content === 'string' &&
      (m.images === undefined || (Array.isArray(m.images) && m.images.every((u) => typeof u === 'string' && u.startsWith('data:image/')))));
}

// The export file: {"osprey_conversations": 1, "conversations": [...]}.
export function exportJson(list) {
  return JSON.stringify({ osprey_conversations: 1, conversations: list }, null, 2);
}

// Reads an export file (or one conversation object); throws an Error naming what is wrong.
// Imported conversations get fresh ids so they never replace existing ones.
export function importJson(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new Error(`the file is not JSON: ${e.message}`);
  }
  const list = Array.isArray(data?.conversations) ? data.conversations : [data];
  const out = [];
  list.forEach((c, i) => {
    if (!isConversation(c))
      throw new Error(`conversation ${i} needs "id", "title" and "messages" (each with a "role" of user or assistant, a string "content" and, optionally, "images": data:image/ URLs)`);
    out.push({ ...newConversation(), ...c, settings: { ...defaultSettings(), ...(c.settings || {}) }, id: newConversation().id });
  });
  return out;
}
