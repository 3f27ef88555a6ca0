"""`text:tickets`: support tickets torchship writes itself, seeded, so the suite depends on no third-party licence.

Each ticket is a product context, a label-bearing request, often a distractor (another class's words, told as past
or as a side remark), generic filler, and noise (typos, lower-casing, dropped punctuation); a share of the labels is
flipped. So the words carry the class but not trivially: TF-IDF + logistic regression lands near 0.9 macro-F1, not 1.

`drift` in [0, 1] moves the topic mix from the reference products to new ones (other nouns, other jargon) and the
register from formal to chat-like: a topic and vocabulary shift for the monitor, with the labelling unchanged. A
chat-like writer also says what is wrong in words of their own (slang requests the reference tickets never use), so
a model trained on the reference alone misreads many shifted tickets, and a retrain on labelled shifted tickets has
something to learn. At drift 0 the tickets are exactly those of a generator without these.
"""
from __future__ import annotations

import random

import pandas as pd

CLASSES = ("billing", "technical", "account", "shipping")
REFERENCE_TOPICS = ("mobile app", "web shop", "smart watch")
SHIFTED_TOPICS = ("smart speaker", "meal kit", "e-bike")
LABEL_NOISE = 0.04         # share of tickets whose label is another class's (annotators disagree)
DISTRACTOR = 0.25          # share of tickets that also mention another class's words
VAGUE = 0.1                # share of tickets whose request is only a weak cue of its class
TYPO = 0.04                # chance per word of a typo
TRIES = 8                  # draws of a ticket until it is not an exact copy of an earlier one

REQUESTS = {
    "billing": ["I was charged twice for {thing}", "please refund the {amount} you took from my card",
                "my invoice shows the wrong amount", "the price went up without any notice",
                "I want my money back for {thing}", "the promo code did not lower my bill",
                "why is there a {amount} fee on my statement", "cancel the payment for order {order}",
                "the subscription renewed and billed me although I cancelled", "you took {amount} twice this month"],
    "technical": ["{thing} crashes every time I open it", "I get error {code} when I try to save",
                  "{thing} keeps freezing after the update", "{thing} will not sync anymore",
                  "the screen goes black after a few seconds", "the latest update broke {thing}",
                  "{thing} shows a blank page", "the battery drains in an hour since version {version}",
                  "notifications stopped working on {thing}", "{thing} restarts on its own"],
    "account": ["I cannot log in to my account", "please reset my password", "I am locked out of my profile",
                "the verification code never arrives", "how do I change the email on my account",
                "please delete my account and my data", "someone else signed in to my account",
                "my username disappeared", "the two-factor login fails every time", "I want to merge my two profiles"],
    "shipping": ["my package has not arrived", "the tracking number {order} shows nothing",
                 "the parcel was delivered to the wrong address", "the box arrived damaged",
                 "the courier never came", "order {order} is stuck in the warehouse",
                 "the delivery is {days} days late", "I received someone else's parcel",
                 "can you ship to my new address instead", "half of my order is missing from the box"],
}
# the chat register's own requests (drift): other words for the same four problems
SLANG_REQUESTS = {
    "billing": ["got overcharged for {thing} smh", "they hit my card 2x for {amount}", "double debit on my bank app",
                "pls give me my cash back for {thing}", "why am i paying {amount} extra",
                "that renewal fee is a ripoff"],
    "technical": ["{thing} is glitching nonstop", "{thing} keeps lagging and buffering", "bug after patch {version}",
                  "{thing} is bricked", "stuck on the loading spinner forever", "{thing} wont boot up"],
    "account": ["cant sign in at all", "my login got hacked", "pw reset link is dead", "locked out again ugh",
                "otp code never shows up", "how do i nuke my profile"],
    "shipping": ["where tf is my delivery", "courier ghosted me", "tracking {order} is blank for days",
                 "box showed up smashed", "the driver dropped it at my neighbours", "still nothing at my door"],
}
# weak cues: each could come from two classes, so the class is a guess beyond the word
VAGUE_REQUESTS = {"billing": ["something is wrong with my order {order}", "the app says my plan expired"],
                  "technical": ["it does not work since yesterday", "the app says my plan expired"],
                  "account": ["I cannot get into the app since yesterday", "something is wrong with my profile"],
                  "shipping": ["something is wrong with my order {order}", "I am still waiting since last week"]}
PAST = ["last month {past} but that got sorted", "a friend told me {past} too", "unlike last time when {past}",
        "I know {past} happens to others", "it is not that {past}"]
FILLER = ["this is the third time I write", "please fix this today", "thanks in advance", "I have been a customer "
          "for years", "nothing happened after I tried again", "your chat bot did not help", "kind regards"]
# a detail with numbers in nearly every ticket: two tickets from the same template are not near copies
DETAIL = ["it started on {weekday} around {time}", "my customer number is {customer}", "I tried it on {n} devices",
          "this is about order {order} from {month} {day}", "I called on {weekday} at {time} and waited {n} minutes",
          "my reference is {customer}", "we are {n} people in the household", "it happened {n} times since {month}"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
GREETING = ["Hello,", "Hi team,", "Dear support,", "Good morning,", ""]
TOPIC_WORDS = {
    "mobile app": ["the app", "the android app", "the iphone app", "your app"],
    "web shop": ["the web shop", "the checkout page", "the website", "the online store"],
    "smart watch": ["my watch", "the watch", "the fitness tracker", "the watch face"],
    "smart speaker": ["the speaker", "the voice assistant", "my speaker", "the sound bar"],
    "meal kit": ["the meal box", "the recipe kit", "my meal plan", "the food box"],
    "e-bike": ["the e-bike", "the bike battery", "the motor", "the bike display"],
}
CONTEXT = {"mobile app": "I use {thing} on my phone every day", "web shop": "I ordered through {thing} last week",
           "smart watch": "I bought {thing} in spring", "smart speaker": "I set up {thing} in the kitchen",
           "meal kit": "we get {thing} every week", "e-bike": "I ride {thing} to work"}
SIGN_OFF = ["Anna", "Ben", "Carla", "Dev", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jun", "Kofi", "Lea", "Mia",
            "Noor", "Omar", "Pia", "Raj", "Sam", "Tara", "Uma", "Vic", "Wen", "Yara", "Zoe"]
CHAT = ["pls", "asap", "lol", "!!!", "tbh", "fr", "smh"]   # the shifted register's words


def generate_tickets(count: int, seed: int, drift: float = 0.0) -> pd.DataFrame:
    """`count` tickets as (text, label, topic), balanced over CLASSES, the same for the same seed and drift."""
    rng = random.Random(seed)
    weights = [1 - drift] * len(REFERENCE_TOPICS) + [drift] * len(SHIFTED_TOPICS)
    if not any(weights):
        weights = [1.0] * len(weights)
    topics = rng.choices(REFERENCE_TOPICS + SHIFTED_TOPICS, weights=weights, k=count)
    rows, seen = [], set()
    for i, topic in enumerate(topics):
        label = CLASSES[i % len(CLASSES)]
        for _ in range(TRIES):   # a short ticket can repeat by chance: a copy would be a duplicate to refuse
            text = _ticket(rng, label, topic, drift)
            if text not in seen:
                break
        seen.add(text)
        if rng.random() < LABEL_NOISE:
            label = rng.choice([c for c in CLASSES if c != label])
        rows.append((text, label, topic))
    return pd.DataFrame(rows, columns=["text", "label", "topic"])


def _ticket(rng: random.Random, label: str, topic: str, drift: float) -> str:
    """One ticket's sentences, noised."""
    slots = {"thing": rng.choice(TOPIC_WORDS[topic]), "amount": f"${rng.randint(3, 400)}.{rng.randint(0, 99):02d}",
             "order": f"#{rng.randint(10000, 99999)}", "code": str(rng.choice([400, 403, 404, 500, 502, 1007])),
             "version": f"{rng.randint(1, 9)}.{rng.randint(0, 20)}", "days": str(rng.randint(2, 15)),
             "weekday": rng.choice(WEEKDAYS), "time": f"{rng.randint(6, 23)}:{rng.randint(0, 59):02d}",
             "customer": f"C-{rng.randint(100000, 999999)}", "n": str(rng.randint(2, 40)),
             "month": rng.choice(MONTHS), "day": str(rng.randint(1, 28))}
    pool = VAGUE_REQUESTS[label] if rng.random() < VAGUE else REQUESTS[label]
    if drift and rng.random() < drift:   # no draw at drift 0: the reference tickets stay what they were
        pool = SLANG_REQUESTS[label]
    sentences = [rng.choice(GREETING), CONTEXT[topic].format(**slots), rng.choice(pool).format(**slots)]
    if rng.random() < DISTRACTOR:
        other = rng.choice([c for c in CLASSES if c != label])
        past = rng.choice(REQUESTS[other]).format(**slots)
        sentences.insert(rng.randint(1, len(sentences)), rng.choice(PAST).format(past=past[0].lower() + past[1:]))
    if rng.random() < 0.95:
        sentences.insert(rng.randint(2, len(sentences)), rng.choice(DETAIL).format(**slots))
    sentences += rng.sample(FILLER, rng.randint(0, 2))
    if rng.random() < 0.6:
        sentences.append(f"{rng.choice(SIGN_OFF)} ({rng.randint(100, 999)})" if rng.random() < 0.5 else
                         rng.choice(SIGN_OFF))
    if rng.random() < drift:
        sentences.append(" ".join(rng.sample(CHAT, rng.randint(1, 3))))
    text = " ".join(s if s.endswith((",", "!")) else s + "." for s in sentences if s)
    return _noised(rng, text, formal=rng.random() >= drift)


def _noised(rng: random.Random, text: str, formal: bool) -> str:
    """Typos (a swapped, dropped or doubled letter), and for an informal writer lower case without punctuation."""
    words = text.split()
    for i, word in enumerate(words):
        if len(word) > 3 and rng.random() < TYPO:
            at = rng.randint(1, len(word) - 2)
            kind = rng.randrange(3)
            words[i] = (word[:at] + word[at + 1] + word[at] + word[at + 2:] if kind == 0 else
                        word[:at] + word[at + 1:] if kind == 1 else word[:at] + word[at] + word[at:])
    text = " ".join(words)
    if not formal or rng.random() < 0.2:
        text = text.lower().replace(".", "").replace(",", "")
    return text
