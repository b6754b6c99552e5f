// Kaiwa's web chat page: the conversations of one person, kept live from one event stream.
//
// Why it is shaped so:
// - The server owns every bubble; the page only mirrors it. Each `bubble` event carries a bubble's
//   whole current state, so the page upserts it by id into a map per conversation and ignores a
//   state no newer (by seq) than the one it has: an event replayed after a reconnect, or seen
//   twice, changes nothing, and a bubble is on screen exactly once (or not at all once its state
//   says `deleted`). The person's own message, too, appears when the server's event comes, never
//   before.
// - The server sanitizes Markdown into `html`; that is the only HTML the page ever sets. Every
//   other text it shows (titles, labels, errors) goes through textContent.
// - One EventSource at a time, following the open conversation (its bubbles and activity) and
//   the whole list: opening another conversation opens another stream, resumed from the last
//   event the page saw while that conversation was open, so a conversation left and come back
//   to gets only what changed meanwhile, and a reply written elsewhere goes on (the list marks
//   it). EventSource reconnects by itself with Last-Event-ID; when the browser gives up on it
//   (an HTTP error), the page opens a new one with `?last=<seq>`.
// - What a reply is doing (`activity`: its status line, the model's thinking) shows under the
//   conversation, the thinking folded away; a bubble's `cards` (a status message's sub-agents)
//   show as live cards, updated in place so a half-typed "Tell" keeps its words.
// - A message carries a client_id made once, so a retry after a network failure is the same
//   message to the server (never answered twice); messages leave one at a time, in order.
// - The CSP forbids inline script and style: no HTML strings, no style attributes.
// - Pictures (pasted, dropped or chosen) go with the next message as base64; the server tells
//   their kind by their bytes and keeps them with the bubble, which shows them from the server
//   (`/api/image`), so a reload shows them as sent. Until then a preview is a local blob: URL.
// - Any other file (a document, a recording) goes the same way, in `files`, shown as a chip
//   until sent and then in the bubble as a link that downloads it back (`/api/file`). The caps
//   are the server's (channels/web/uploads.py), checked here first so the person hears them
//   before a long upload; the server says the same words if a page gets past them.
"use strict";

(() => {
  const RETRY_FIRST_MS = 500;
  const RETRY_MOST_MS = 8000;
  const RETRYABLE_STATUSES = new Set([502, 503, 504]);
  const NEAR_BOTTOM_PX = 48;
  const WHO = { person: "You", kaiwa: "Kaiwa", notice: "Notice" };
  const PICTURES_MOST = 4;
  const PICTURE_BYTES_MOST = 10 * 1024 * 1024;
  const PICTURE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
  const FILES_MOST = 10;
  const FILE_BYTES_MOST = 25 * 1024 * 1024;
  const FILES_BYTES_MOST = 50 * 1024 * 1024; // a message's files together
  const SIGNED_OUT =
    "Signed out: open the link Kaiwa printed (web chat: …), or run `kaiwa web-link` for a new one.";

  const element = (id) => document.getElementById(id);
  const ui = {
    newConversation: element("new-conversation"),
    list: element("conversations"),
    title: element("conversation-title"),
    connection: element("connection"),
    log: element("log"),
    problem: element("problem"),
    composer: element("composer"),
    message: element("message"),
    attached: element("attached"),
    views: element("views"),
    addPicture: element("add-picture"),
    pictureFile: element("picture-file"),
    attachFiles: element("attach-files"),
    anyFile: element("any-file"),
    answer: element("answer"),
    answerTitle: element("answer-title"),
    closeAnswer: element("close-answer"),
    status: element("status"),
    thinking: element("thinking"),
  };

  const state = {
    conversations: new Map(), // id → {id, title, updated, writing}
    bubbles: new Map(), // conversation id → Map(bubble id → bubble)
    open: null, // the id of the conversation on screen
    shown: new Map(), // bubble id → its element, for the open conversation
    items: new Map(), // conversation id → its list item
    seenIn: new Map(), // conversation id ("" for none) → the last event id its stream saw
    activity: new Map(), // conversation id → {status, thinking, seq}
    attached: [], // pictures for the next message: {name, data (base64), preview (blob: URL)}
    files: [], // other files for the next message: {name, type, size, data (base64)}
  };

  // ---- talking to the server ----

  class Refused extends Error {
    constructor(status, detail) {
      super(status === 401 ? SIGNED_OUT : `the server answered ${status}${detail ? `: ${detail}` : ""}`);
      this.status = status;
    }
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function refusal(response) {
    const text = (await response.text().catch(() => "")).trim();
    let detail = text;
    try {
      const body = JSON.parse(text);
      detail = body.error || body.message || text;
    } catch {
      // not JSON: the text as it is
    }
    return new Refused(response.status, String(detail).slice(0, 200));
  }

  async function request(method, path, body) {
    const options = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (method === "POST") {
      options.headers["Content-Type"] = "application/json";
      options.headers["X-Kaiwa"] = "1";
      options.body = JSON.stringify(body ?? {});
    }
    const response = await fetch(path, options);
    if (!response.ok) {
      throw await refusal(response);
    }
    return response.status === 204 ? {} : response.json().catch(() => ({}));
  }

  const post = (path, body) => request("POST", path, body);

  function isNetworkFailure(error) {
    // fetch rejects with a TypeError when no answer came; a proxy's gateway errors are the same
    return error instanceof TypeError || (error instanceof Refused && RETRYABLE_STATUSES.has(error.status));
  }

  function say(target, text) {
    target.textContent = text;
  }

  // ---- the conversation list ----

  const newestFirst = (a, b) =>
    (Date.parse(b.updated) || 0) - (Date.parse(a.updated) || 0) || (a.id < b.id ? -1 : 1);

  function remember(conversation) {
    const known = state.conversations.get(conversation.id);
    if (known && (Date.parse(known.updated) || 0) > (Date.parse(conversation.updated) || 0)) {
      return; // a later state came by the stream while the list was on its way
    }
    state.conversations.set(conversation.id, { ...known, ...conversation });
  }

  function listItem(id) {
    let item = state.items.get(id);
    if (!item) {
      item = document.createElement("li");
      const link = document.createElement("a");
      link.href = `#${encodeURIComponent(id)}`;
      const title = document.createElement("span");
      title.className = "title";
      const writing = document.createElement("span");
      writing.className = "writing";
      writing.setAttribute("role", "img");
      writing.setAttribute("aria-label", "writing");
      link.append(title, writing);
      item.append(link);
      state.items.set(id, item);
    }
    return item;
  }

  function renderList() {
    const conversations = [...state.conversations.values()].sort(newestFirst);
    conversations.forEach((conversation, index) => {
      const item = listItem(conversation.id);
      const link = item.firstElementChild;
      say(link.querySelector(".title"), conversation.title || "New conversation");
      link.querySelector(".writing").hidden = !conversation.writing;
      if (conversation.id === state.open) {
        link.setAttribute("aria-current", "page");
      } else {
        link.removeAttribute("aria-current");
      }
      if (ui.list.children[index] !== item) {
        ui.list.insertBefore(item, ui.list.children[index] ?? null); // moves only what moved
      }
    });
    renderTitle();
  }

  function renderTitle() {
    const open = state.open && state.conversations.get(state.open);
    const title = open ? open.title || "New conversation" : state.open ? "New conversation" : "Kaiwa";
    say(ui.title, title);
    document.title = title === "Kaiwa" ? "Kaiwa" : `${title} · Kaiwa`;
  }

  async function loadConversations() {
    try {
      const { conversations = [] } = await request("GET", "/api/conversations");
      conversations.forEach(remember);
      renderList();
      return true;
    } catch (error) {
      say(ui.problem, error instanceof Refused ? error.message : "Cannot reach Kaiwa.");
      return false;
    }
  }

  async function startConversation() {
    try {
      const { id } = await post("/api/conversations");
      remember({ id, title: "New conversation", updated: new Date().toISOString(), writing: false });
      location.hash = encodeURIComponent(id); // opens it (hashchange)
      openConversation(id);
      return id;
    } catch (error) {
      say(ui.problem, `No new conversation: ${error instanceof Refused ? error.message : "cannot reach Kaiwa."}`);
      return null;
    }
  }

  // ---- bubbles ----

  const creationOrder = (a, b) =>
    (Date.parse(a.at) || 0) - (Date.parse(b.at) || 0) || (a.seq ?? 0) - (b.seq ?? 0);

  function bubblesOf(conversation) {
    let bubbles = state.bubbles.get(conversation);
    if (!bubbles) {
      bubbles = new Map();
      state.bubbles.set(conversation, bubbles);
    }
    return bubbles;
  }

  function upsert(bubble) {
    const bubbles = bubblesOf(bubble.conversation);
    const known = bubbles.get(bubble.id);
    if (known && (known.seq ?? 0) >= (bubble.seq ?? 0)) {
      return; // seen already: nothing changes
    }
    bubbles.set(bubble.id, bubble);
    if (bubble.conversation === state.open) {
      keepingTheBottom(() => show(bubble));
    }
  }

  function bubbleElement(bubble) {
    const role = WHO[bubble.role] ? bubble.role : "notice";
    const article = document.createElement("article");
    article.className = `bubble ${role}`;
    article.dataset.id = bubble.id;
    const who = document.createElement("span");
    who.className = "who";
    say(who, `${WHO[role]}:`);
    const body = document.createElement("div");
    body.className = "body";
    const pictures = document.createElement("div");
    pictures.className = "pictures";
    for (const id of bubble.images ?? []) {
      const picture = document.createElement("img");
      picture.src = `/api/image?id=${encodeURIComponent(id)}`;
      picture.alt = role === "person" ? "A picture you sent" : "A picture";
      pictures.append(picture);
    }
    const buttons = document.createElement("div");
    buttons.className = "buttons";
    article.append(who, body, pictures, sentFiles(bubble.files ?? []), buttons);
    return article;
  }

  function sentFiles(files) {
    // each a link that downloads it back: the server sends it as bytes to save, never to show
    const list = document.createElement("ul");
    list.className = "files";
    for (const file of files) {
      const item = document.createElement("li");
      item.className = file.kind === "audio" ? "file audio" : "file";
      const link = document.createElement("a");
      link.href = `/api/file?id=${encodeURIComponent(file.id)}`;
      link.download = file.name;
      say(link, file.name);
      const size = document.createElement("span");
      size.className = "size";
      say(size, sizeWords(file.size));
      item.append(link, " ", size);
      list.append(item);
    }
    return list;
  }

  function sizeWords(count) {
    // as the server says it (channels/web/uploads.py): 31 MB, 203.5 KB, 900 bytes
    for (const [unit, scale] of [["MB", 1024 * 1024], ["KB", 1024]]) {
      if (count >= scale) {
        return `${(count / scale).toFixed(1).replace(/\.0$/, "")} ${unit}`;
      }
    }
    return `${count} bytes`;
  }

  function place(article, bubble) {
    // a new bubble is almost always the last: look from the end for the first one not after it
    let next = null;
    for (let other = ui.log.lastElementChild; other; other = other.previousElementSibling) {
      const shown = bubblesOf(state.open).get(other.dataset.id);
      if (shown && creationOrder(shown, bubble) <= 0) {
        break;
      }
      next = other;
    }
    ui.log.insertBefore(article, next);
  }

  function fill(article, bubble) {
    const body = article.querySelector(".body");
    if (article.dataset.html !== bubble.html) {
      body.innerHTML = bubble.html ?? ""; // sanitized by the server (channels.web.markup)
      article.dataset.html = bubble.html ?? "";
    }
    // buttons are remade only when they change: a streaming update must not swallow a click
    const buttons = JSON.stringify(bubble.buttons ?? []);
    if (article.dataset.buttons !== buttons) {
      article.dataset.buttons = buttons;
      article.querySelector(".buttons").replaceChildren(
        ...(bubble.buttons ?? []).map((button) => pressable(bubble.conversation, button)),
      );
    }
    article.classList.toggle("streaming", Boolean(bubble.streaming));
    article.setAttribute("aria-busy", bubble.streaming ? "true" : "false");
    showCards(article, bubble);
  }

  // ---- sub-agents' live cards ----

  function showCards(article, bubble) {
    const cards = bubble.cards ?? [];
    article.classList.toggle("with-cards", cards.length > 0);
    let list = article.querySelector(".cards");
    if (!cards.length) {
      list?.remove();
      return;
    }
    if (!list) {
      list = document.createElement("div");
      list.className = "cards";
      article.querySelector(".body").after(list);
    }
    const kept = new Map([...list.children].map((card) => [card.dataset.key, card]));
    const shown = cards.map((card) => {
      const element = kept.get(card.key) ?? cardElement(bubble.conversation, card);
      fillCard(element, bubble.conversation, card);
      return element;
    });
    shown.forEach((element, index) => {
      if (list.children[index] !== element) {
        list.insertBefore(element, list.children[index] ?? null);
      }
    });
    while (list.children.length > shown.length) {
      list.lastElementChild.remove();
    }
  }

  function cardElement(conversation, card) {
    const element = document.createElement("section");
    element.className = "card";
    element.dataset.key = card.key;
    element.setAttribute("aria-label", `Sub-agent ${card.name}`);
    const name = document.createElement("h3");
    const figures = document.createElement("p");
    figures.className = "figures";
    const controls = document.createElement("div");
    controls.className = "controls";
    const tell = document.createElement("form");
    const words = document.createElement("input");
    words.type = "text";
    words.setAttribute("aria-label", `Tell ${card.name}`);
    words.placeholder = `Tell ${card.name} something…`;
    const send = document.createElement("button");
    send.type = "submit";
    say(send, "Tell");
    tell.append(words, send);
    tell.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = words.value.trim();
      if (text && (await press(send, conversation, `Tell ${card.name}`, `/agents tell ${card.key} ${text}`))) {
        words.value = "";
      }
    });
    element.append(name, figures, controls, tell);
    return element;
  }

  function fillCard(element, conversation, card) {
    say(element.querySelector("h3"), `${card.name} (${card.key})`);
    const calls = `${card.model_calls} model call${card.model_calls === 1 ? "" : "s"}`;
    const seconds = `${Math.round(card.seconds)} s`;
    const model = card.route ? `${card.model} (${card.route})` : card.model;
    say(element.querySelector(".figures"), [card.doing, seconds, model, calls].filter(Boolean).join(" · "));
    const buttons = JSON.stringify(card.buttons ?? []);
    if (element.dataset.buttons !== buttons) {
      element.dataset.buttons = buttons;
      element.querySelector(".controls").replaceChildren(
        ...(card.buttons ?? []).map((button) => pressable(conversation, button)),
      );
    }
    element.querySelector("form").hidden = card.status !== "running";
  }

  // ---- what the reply being written is doing ----

  function noteActivity(activity) {
    const known = state.activity.get(activity.conversation);
    if (known && (known.seq ?? 0) >= (activity.seq ?? 0)) {
      return;
    }
    state.activity.set(activity.conversation, activity);
    if (activity.conversation === state.open) {
      keepingTheBottom(renderActivity);
    }
  }

  function renderActivity() {
    const activity = (state.open && state.activity.get(state.open)) || {};
    const status = activity.status ?? "";
    say(ui.status, status ? `Kaiwa: ${status}` : "");
    ui.thinking.hidden = !activity.thinking;
    say(ui.thinking.querySelector(".text"), activity.thinking ?? "");
  }

  function show(bubble) {
    let article = state.shown.get(bubble.id);
    if (bubble.deleted) {
      article?.remove(); // kept in the map all the same: its seq still tells a replay apart
      state.shown.delete(bubble.id);
      return;
    }
    if (!article) {
      article = bubbleElement(bubble);
      state.shown.set(bubble.id, article);
      place(article, bubble);
    }
    fill(article, bubble);
  }

  function pressable(conversation, { label, command }) {
    const button = document.createElement("button");
    button.type = "button";
    say(button, label);
    button.addEventListener("click", () => press(button, conversation, label, command));
    return button;
  }

  function keepingTheBottom(change) {
    const log = ui.log;
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < NEAR_BOTTOM_PX;
    change();
    if (atBottom) {
      log.scrollTop = log.scrollHeight;
    }
  }

  async function press(button, conversation, label, command) {
    button.disabled = true;
    try {
      const { answer } = await post("/api/press", { conversation, command });
      say(ui.problem, "");
      if (answer) {
        showAnswer(conversation, label, answer);
      }
      return true;
    } catch (error) {
      say(ui.problem, `“${label}” did not reach Kaiwa: ${error instanceof Refused ? error.message : "no connection."}`);
      return false;
    } finally {
      button.disabled = false;
    }
  }

  // a press's answer is the presser's alone (on a platform, a private reply): it shows in a
  // panel of this page, never as a bubble of the conversation
  function showAnswer(conversation, label, { html, buttons = [] }) {
    if (conversation !== state.open) {
      return; // the person moved on meanwhile
    }
    say(ui.answerTitle, label);
    ui.answer.querySelector(".body").innerHTML = html ?? ""; // sanitized by the server
    ui.answer.querySelector(".buttons").replaceChildren(
      ...buttons.map((button) => pressable(conversation, button)),
    );
    ui.answer.hidden = false;
  }

  function closeAnswer() {
    ui.answer.hidden = true;
    ui.answer.querySelector(".body").replaceChildren();
    ui.answer.querySelector(".buttons").replaceChildren();
  }

  function openConversation(id) {
    if (state.open === id) {
      return;
    }
    state.open = id;
    closeAnswer();
    state.shown.clear();
    ui.log.replaceChildren();
    const bubbles = [...bubblesOf(id).values()].filter((bubble) => !bubble.deleted);
    for (const bubble of bubbles.sort(creationOrder)) {
      const article = bubbleElement(bubble);
      state.shown.set(bubble.id, article);
      ui.log.append(article);
      fill(article, bubble);
    }
    renderActivity();
    ui.log.scrollTop = ui.log.scrollHeight;
    renderList();
    follow();
  }

  function conversationInAddress() {
    const raw = location.hash.slice(1);
    try {
      return raw ? decodeURIComponent(raw) : null;
    } catch {
      return null;
    }
  }

  // ---- sending ----

  const outbox = []; // messages not yet accepted, oldest first
  let sending = false;

  function clientId() {
    if (crypto.randomUUID) {
      return crypto.randomUUID();
    }
    // crypto.randomUUID needs a secure context; an allowed_hosts name over http is not one
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    return [...bytes].map((byte) => byte.toString(16).padStart(2, "0")).join("");
  }

  async function send() {
    const text = ui.message.value.trim();
    const pictures = state.attached;
    const chosen = state.files;
    if (!text && !pictures.length && !chosen.length) {
      return;
    }
    ui.message.value = "";
    attach([], []);
    const conversation = state.open ?? (await startConversation());
    if (!conversation) {
      giveBack(text, pictures, chosen);
      return;
    }
    const images = pictures.map((picture) => picture.data);
    const files = chosen.map(({ name, type, data }) => ({ name, type, data }));
    outbox.push({ conversation, text, client_id: clientId(), images, files, pictures, chosen });
    if (!sending) {
      sending = true;
      try {
        while (outbox.length) {
          await deliver(outbox[0]);
          outbox.shift();
        }
      } finally {
        sending = false;
      }
    }
  }

  async function deliver(message) {
    for (let wait = RETRY_FIRST_MS; ; wait = Math.min(wait * 2, RETRY_MOST_MS)) {
      try {
        const { pictures, chosen, ...body } = message;
        await post("/api/messages", body);
        pictures.forEach((picture) => URL.revokeObjectURL(picture.preview));
        say(ui.problem, "");
        return;
      } catch (error) {
        if (!isNetworkFailure(error)) {
          say(ui.problem, `Not sent: ${error.message}`);
          giveBack(message.text, message.pictures, message.chosen);
          return;
        }
        say(ui.problem, "Not sent yet: no connection to Kaiwa. Trying again…");
        await sleep(wait);
      }
    }
  }

  function giveBack(text, pictures = [], files = []) {
    if (!ui.message.value) {
      ui.message.value = text; // nothing the person wrote is lost
    }
    if (!state.attached.length && !state.files.length) {
      attach(pictures, files);
    }
  }

  // ---- pictures and files for the next message ----

  function attach(pictures, files = state.files) {
    state.attached = pictures;
    state.files = files;
    ui.attached.replaceChildren(
      ...pictures.map((picture, index) => {
        const preview = document.createElement("img");
        preview.src = picture.preview;
        preview.alt = picture.name;
        return chip(picture.name, preview, () => {
          URL.revokeObjectURL(picture.preview);
          attach(state.attached.filter((_, other) => other !== index));
        });
      }),
      ...files.map((file, index) => {
        const named = document.createElement("span");
        named.className = "file";
        say(named, `${file.name} (${sizeWords(file.size)})`);
        return chip(file.name, named, () => attach(state.attached, state.files.filter((_, other) => other !== index)));
      }),
    );
  }

  function chip(name, shown, remove) {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    say(button, `Remove ${name}`);
    button.addEventListener("click", remove);
    item.append(shown, button);
    return item;
  }

  function base64Of(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.addEventListener("load", () => resolve(String(reader.result).split(",", 2)[1] ?? ""));
      reader.addEventListener("error", () => reject(reader.error));
      reader.readAsDataURL(file);
    });
  }

  async function takePictures(files) {
    const taken = [];
    for (const file of files) {
      if (!PICTURE_TYPES.has(file.type)) {
        say(ui.problem, `${file.name || "That file"} is not a picture Kaiwa takes (PNG, JPEG, GIF or WebP).`);
      } else if (file.size > PICTURE_BYTES_MOST) {
        say(ui.problem, `${file.name || "That picture"} is larger than 10 MB.`);
      } else if (state.attached.length + taken.length >= PICTURES_MOST) {
        say(ui.problem, `A message takes at most ${PICTURES_MOST} pictures.`);
      } else {
        const name = file.name || `picture ${state.attached.length + taken.length + 1}`;
        taken.push({ name, data: await base64Of(file), preview: URL.createObjectURL(file) });
      }
    }
    if (taken.length) {
      attach([...state.attached, ...taken]);
    }
  }

  async function takeFiles(files) {
    const taken = [];
    for (const file of files) {
      const name = file.name || `file ${state.files.length + taken.length + 1}`;
      const together = [...state.files, ...taken].reduce((sum, each) => sum + each.size, file.size);
      if (file.size > FILE_BYTES_MOST) {
        say(ui.problem, `${name} is ${sizeWords(file.size)}; the web chat takes files up to ${sizeWords(FILE_BYTES_MOST)}.`);
      } else if (state.files.length + taken.length >= FILES_MOST) {
        say(ui.problem, `A message takes at most ${FILES_MOST} files: send the others with the next message.`);
      } else if (together > FILES_BYTES_MOST) {
        say(
          ui.problem,
          `With ${name} these files are ${sizeWords(together)} together; the web chat takes up to ` +
            `${sizeWords(FILES_BYTES_MOST)} in one message: send it with the next message.`,
        );
      } else {
        taken.push({ name, type: file.type, size: file.size, data: await base64Of(file) });
      }
    }
    if (taken.length) {
      attach(state.attached, [...state.files, ...taken]);
    }
  }

  function take(files) {
    // a picture goes as a picture (the model may see it), anything else as a file
    takePictures(files.filter((file) => PICTURE_TYPES.has(file.type)));
    takeFiles(files.filter((file) => !PICTURE_TYPES.has(file.type)));
  }

  // ---- the event stream ----

  let source = null;
  let reconnecting = false;
  let reopenWait = RETRY_FIRST_MS;

  function seen(following, event) {
    const seq = Number(event.lastEventId);
    const last = state.seenIn.get(following);
    if (event.lastEventId !== "" && Number.isFinite(seq) && (last === undefined || seq > last)) {
      state.seenIn.set(following, seq);
    }
  }

  function parsed(event) {
    try {
      return JSON.parse(event.data);
    } catch {
      console.warn("kaiwa: an event that is not JSON", event.type, event.data);
      return null;
    }
  }

  function follow() {
    // the stream of the open conversation (or of the list alone), instead of the one before
    if (source && source.following === (state.open ?? "")) {
      return;
    }
    source?.close();
    connect();
  }

  function connect() {
    const following = state.open ?? "";
    const query = new URLSearchParams();
    if (following) {
      query.set("conversation", following);
    }
    if (state.seenIn.has(following)) {
      query.set("last", state.seenIn.get(following));
    }
    const opened = new EventSource(`/api/events${query.size ? `?${query}` : ""}`);
    opened.following = following;
    source = opened;
    const current = () => source === opened;
    opened.addEventListener("open", () => {
      reopenWait = RETRY_FIRST_MS;
      if (reconnecting) {
        reconnecting = false;
        say(ui.connection, "");
        loadConversations(); // the list as it is now, whatever the stream replays
      }
    });
    opened.addEventListener("error", () => {
      if (!current()) {
        return;
      }
      reconnecting = true;
      say(ui.connection, "Reconnecting…");
      if (opened.readyState === EventSource.CLOSED) {
        // the browser gave up (an HTTP error): open a new stream from the last event seen
        loadConversations(); // shows "Signed out" when that is why
        setTimeout(() => current() && connect(), reopenWait);
        reopenWait = Math.min(reopenWait * 2, RETRY_MOST_MS);
      }
    });
    const on = (kind, take) =>
      opened.addEventListener(kind, (event) => {
        if (!current()) {
          return;
        }
        seen(following, event);
        const data = parsed(event);
        if (data) {
          take(data);
        }
      });
    on("bubble", (bubble) => bubble.id && bubble.conversation && upsert(bubble));
    on("activity", (activity) => activity.conversation && noteActivity(activity));
    on("conversation", (conversation) => {
      if (conversation.id) {
        remember(conversation);
        renderList();
      }
    });
  }

  // ---- wiring ----

  ui.newConversation.addEventListener("click", async () => {
    if (await startConversation()) {
      ui.message.focus();
    }
  });
  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  ui.message.addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.files ?? [])];
    if (files.length) {
      event.preventDefault();
      take(files);
    }
  });
  ui.composer.addEventListener("dragover", (event) => event.preventDefault());
  ui.composer.addEventListener("drop", (event) => {
    const files = [...(event.dataTransfer?.files ?? [])];
    if (files.length) {
      event.preventDefault();
      take(files);
    }
  });
  ui.addPicture.addEventListener("click", () => ui.pictureFile.click());
  ui.attachFiles.addEventListener("click", () => ui.anyFile.click());
  ui.closeAnswer.addEventListener("click", closeAnswer);
  // the views of a conversation (its sub-agents, tasks, plans, usage) are its commands' answers,
  // with their buttons (Stop one sub-agent, pause a task), as typed
  for (const button of ui.views.querySelectorAll("button[data-command]")) {
    button.addEventListener("click", async () => {
      const conversation = state.open ?? (await startConversation());
      if (conversation) {
        press(button, conversation, button.textContent, button.dataset.command);
      }
    });
  }
  ui.pictureFile.addEventListener("change", () => {
    takePictures([...ui.pictureFile.files]);
    ui.pictureFile.value = "";
  });
  ui.anyFile.addEventListener("change", () => {
    take([...ui.anyFile.files]);
    ui.anyFile.value = "";
  });
  ui.message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
      event.preventDefault();
      send();
    }
  });
  window.addEventListener("hashchange", () => {
    const id = conversationInAddress();
    if (id) {
      openConversation(id);
    }
  });

  const fromAddress = conversationInAddress();
  if (fromAddress) {
    openConversation(fromAddress);
  } else {
    follow();
  }
  loadConversations().then(() => {
    if (!state.open && state.conversations.size) {
      const [newest] = [...state.conversations.values()].sort(newestFirst);
      history.replaceState(null, "", `#${encodeURIComponent(newest.id)}`);
      openConversation(newest.id);
    }
  });
})();
