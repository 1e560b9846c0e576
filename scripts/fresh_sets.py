"""Fresh test sets for the calibration benchmark (`benchmarks/calibration.py --split fresh-a`).

A fresh set is generated clips that differ from every clip the shipped calibrators were fitted,
chosen or scored on (the calibration fit clips, the OCR and speech sets' `dev`, `heldout` and
`fresh` splits, their redrawn and reseeded copies, the bundled lecture) on every axis the
generators offer:

- fonts: faces of the same Debian packages (fonts-dejavu, fonts-liberation, fonts-freefont-ttf)
  that no generator names (`make_demo_clip.FONTS` after `make_ocr_hard_set` added its own);
- layouts and contents: OCR slides written here (other tables, code, photos, columns, lists),
  the speech clips' slides in other themes and other places on the slide, other lecture topics
  (sentences and slide text no speech clip says or shows);
- voices: espeak-ng voice variants that no clip uses (nor the babble noise), each on one of the
  eight English accents espeak offers (each voice's audio differs from every voice used before:
  tests/unit/test_calibration.py); no human reader (the two shipped recordings are used);
- seeds: every random draw (slide choice, face, size, degradation, noise, pauses, photos) from
  seeds in the set's own range, far from every seed used before (those are below 11,000).

Kept from the generators, as conditions rather than identities: the noise kinds (white, pink,
brown, babble, none), speeds (130-185 words/min), music bed, the degradations of
`benchmarks/calibration.py` (`degrade`), H.264 settings and the five vision policies.

A set is defined before it is scored and never changed after; scoring it never chooses anything
(docs/calibration.md, "Pre-registered fresh tests").
"""

from __future__ import annotations

from dataclasses import dataclass

from make_demo_clip import FONTS, TextBlock
from make_ocr_hard_set import INK, WHITE, HardSlide, Photo, Table, _tb
from make_speech_set import Topic

RGB = tuple[int, int, int]

# Faces no generator names (same three Debian packages). Registered in FONTS here.
FRESH_FACES: dict[str, str] = {
    "dejavu-sans-oblique": "dejavu/DejaVuSans-Oblique.ttf",
    "dejavu-sans-bold-oblique": "dejavu/DejaVuSans-BoldOblique.ttf",
    "dejavu-sans-extralight": "dejavu/DejaVuSans-ExtraLight.ttf",
    "dejavu-serif-condensed-italic": "dejavu/DejaVuSerifCondensed-Italic.ttf",
    "dejavu-mono-oblique": "dejavu/DejaVuSansMono-Oblique.ttf",
    "liberation-narrow-italic": "liberation/LiberationSansNarrow-Italic.ttf",
    "liberation-sans-bold-italic": "liberation/LiberationSans-BoldItalic.ttf",
    "free-sans-oblique": "freefont/FreeSansOblique.ttf",
    "free-sans-bold-oblique": "freefont/FreeSansBoldOblique.ttf",
    "free-serif-bold": "freefont/FreeSerifBold.ttf",
    "free-mono": "freefont/FreeMono.ttf",
    "free-mono-bold": "freefont/FreeMonoBold.ttf",
    # Left for a later set: dejavu Sans/SerifCondensed (Bold)Oblique/BoldItalic,
    # DejaVuSerif-BoldItalic, DejaVuSansMono-BoldOblique, LiberationMono-(Bold)Italic,
    # LiberationSansNarrow-BoldItalic, LiberationSerif-BoldItalic, FreeMono(Bold)Oblique,
    # FreeSerif(Bold)Italic.
}

#: What the earlier generators use (checked by tests/unit/test_calibration.py).
USED_VOICE_VARIANTS = frozenset(
    ["m1", "m2", "m3", "m7", "f1", "f2", "f3", "f4", "f5", "klatt", "grandpa", "Andy", "Gene", "Mr"]
)
ACCENTS = [
    "en-gb-x-rp",
    "en-us",
    "en-gb-scotland",
    "en-029",
    "en-gb-x-gbcwmd",
    "en-us-nyc",
    "en-gb-x-gbclan",
    "en",  # British; not "en-gb": espeak-ng 1.51 ignores a variant after "en-gb" (same audio)
]


@dataclass(frozen=True)
class SlideLayout:
    """Where the speech clips' slides put their title and body (body lines get a bullet mark
    when `bullet` is set)."""

    title_x: int
    title_y: int
    title_align: str
    body_x: int
    body_y: int
    body_align: str
    bullet: RGB | None = None


@dataclass(frozen=True)
class FreshSet:
    name: str
    seed: int  # every draw of the set comes from seeds in [seed, seed + 1000)
    topics: dict[str, Topic]
    voices: list[str]  # one speech clip per voice, topics in turn
    slide_faces: list[tuple[str, str]]  # (body, title) of the speech clips' slides
    themes: list[tuple[RGB, RGB]]  # (background, ink) of the speech clips' slides
    layouts: list[SlideLayout]
    ocr_slides: list[HardSlide]  # drawn as the OCR set is (3 per clip) and redrawn
    redraws: int  # clips of 3 `ocr_slides` drawn again in other fresh faces, degraded

    @property
    def faces(self) -> list[str]:
        """Every face the set draws with."""
        out = {f for pair in self.slide_faces for f in pair}
        for slide in self.ocr_slides:
            for it in slide.items:
                if isinstance(it, Photo) and not it.text:
                    continue  # draws no letters: its (default) face is never used
                out |= {getattr(it, "font", ""), getattr(it, "header_font", "")}
        return sorted(out - {""})


_VARIANTS_A = [
    "m4",
    "Annie",
    "klatt2",
    "m5",
    "linda",
    "Lee",
    "m6",
    "steph",
    "Michael",
    "rob",
    "edward",
    "m8",
    "david",
    "Alicia",
    "paul",
    "klatt3",
    "max",
    "belinda",
    "john",
    "grandma",
    "norbert",
    "travis",
    "zac",
    "quincy",
]

TOPICS_A: dict[str, Topic] = {
    "volcanoes": Topic(
        [
            ["Volcanic eruptions", "basaltic lava flows", "pyroclastic density currents"],
            ["Monitoring volcanoes", "seismometers and tiltmeters", "sulfur dioxide emissions"],
        ],
        [
            "Basaltic lava flows move slowly enough for people to walk away.",
            "Pyroclastic density currents are far more dangerous than lava.",
            "Seismometers and tiltmeters show magma rising under the summit.",
            "A sudden rise in sulfur dioxide emissions can warn of an eruption.",
        ],
    ),
    "compilers": Topic(
        [
            ["Compiler front end", "lexical analysis and parsing", "abstract syntax tree"],
            ["Code generation", "constant folding", "register allocation"],
        ],
        [
            "Every compiler front end starts with lexical analysis and parsing.",
            "The parser builds an abstract syntax tree for each function.",
            "Constant folding evaluates fixed expressions before the program runs.",
            "Register allocation decides which values live in the processor registers.",
        ],
    ),
    "photosynthesis": Topic(
        [
            ["Photosynthesis", "light dependent reactions", "chlorophyll in the thylakoid"],
            ["The Calvin cycle", "carbon fixation by rubisco", "glucose and starch storage"],
        ],
        [
            "The light dependent reactions split water and release oxygen.",
            "Chlorophyll in the thylakoid membrane absorbs red and blue light.",
            "In the Calvin cycle, rubisco fixes carbon dioxide from the air.",
            "The plant keeps the resulting glucose as starch storage in its leaves.",
        ],
    ),
    "transactions": Topic(
        [
            ["Database transactions", "atomicity and isolation", "write ahead logging"],
            ["Concurrency control", "two phase locking", "multiversion snapshots"],
        ],
        [
            "A transaction either commits completely or leaves no trace at all.",
            "Atomicity and isolation rest on write ahead logging and on locks.",
            "Two phase locking takes every lock before it releases any of them.",
            "With multiversion snapshots, readers never wait for writers.",
        ],
    ),
    "orbits": Topic(
        [
            ["Orbital mechanics", "elliptical orbits", "escape velocity"],
            ["Changing orbits", "Hohmann transfer", "gravity assist from Jupiter"],
        ],
        [
            "Planets travel around the sun on elliptical orbits.",
            "A rocket must reach escape velocity to leave the planet for good.",
            "A Hohmann transfer uses two engine burns to move between circular orbits.",
            "A gravity assist from Jupiter can save years of travel time.",
        ],
    ),
    "cryptography": Topic(
        [
            ["Public key cryptography", "modular exponentiation", "elliptic curve signatures"],
            ["Key exchange", "Diffie Hellman", "forward secrecy"],
        ],
        [
            "Public key cryptography uses a pair of related keys.",
            "Encryption with the RSA scheme relies on modular exponentiation.",
            "Elliptic curve signatures are much shorter for the same security.",
            "Diffie Hellman key exchange with fresh keys gives forward secrecy.",
        ],
    ),
}


def _ocr_slides_a() -> list[HardSlide]:
    navy: RGB = (20, 40, 90)
    return [
        HardSlide(
            "grid_table_sensors",
            (252, 252, 250),
            (
                _tb(["Sensor ranges"], "free-serif-bold", 48, navy, 640, 40, "center"),
                Table(
                    140,
                    140,
                    (320, 200, 200, 200),
                    (
                        ("Sensor", "Min", "Max", "Unit"),
                        ("Pressure", "0.8", "1.3", "bar"),
                        ("Humidity", "21", "87", "%"),
                        ("Supply voltage", "3.1", "3.4", "V"),
                        ("Current", "12", "480", "mA"),
                    ),
                    "dejavu-sans-oblique",
                    "dejavu-sans-bold-oblique",
                    26,
                    "grid",
                    INK,
                    (100, 100, 120),
                    right=(1, 2),
                ),
                _tb(
                    ["Measured at the test bench in March"],
                    "dejavu-sans-oblique",
                    16,
                    (90, 90, 100),
                    140,
                    620,
                ),
            ),
        ),
        HardSlide(
            "code_light_plan",
            (248, 246, 240),
            (
                _tb(["Loading a plan"], "liberation-sans-bold-italic", 46, (90, 30, 30), 80, 40),
                _tb(
                    [
                        "import json",
                        "with open(path) as f:",
                        "    plan = json.load(f)",
                        "steps = len(plan)",
                        "print(steps, 'steps')",
                    ],
                    "free-mono-bold",
                    28,
                    (20, 60, 40),
                    110,
                    160,
                    spacing=1.5,
                ),
                _tb(["plan.py"], "free-mono", 18, (120, 120, 120), 1180, 650, "right"),
            ),
        ),
        HardSlide(
            "photo_banner_right",
            (230, 236, 240),
            (
                _tb(["Coastal survey"], "free-sans-bold-oblique", 46, INK, 60, 40),
                _tb(
                    ["Tide gauges", "Drone flights", "Sand samples"],
                    "free-sans-oblique",
                    30,
                    (40, 50, 60),
                    60,
                    180,
                ),
                Photo(
                    (520, 130, 1220, 620),
                    seed=40011,
                    text=("Lighthouse at low tide", "Photo: survey team, 2024"),
                    font="free-sans-bold-oblique",
                    size_px=28,
                ),
            ),
        ),
        HardSlide(
            "three_columns",
            (255, 255, 255),
            (
                _tb(["Three steps"], "dejavu-sans-bold-oblique", 50, INK, 80, 40),
                _tb(["Collect"], "dejavu-sans-bold-oblique", 32, (0, 110, 90), 80, 170),
                _tb(
                    ["Record the room", "Note the time"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    80,
                    230,
                ),
                _tb(["Label"], "dejavu-sans-bold-oblique", 32, (0, 110, 90), 480, 170),
                _tb(
                    ["Mark each word", "Check twice"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    480,
                    230,
                ),
                _tb(["Train"], "dejavu-sans-bold-oblique", 32, (0, 110, 90), 880, 170),
                _tb(
                    ["Small model first", "Then scale up"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    880,
                    230,
                ),
            ),
        ),
        HardSlide(
            "zebra_table_schedule",
            (250, 248, 255),
            (
                _tb(["Lab schedule"], "free-serif-bold", 50, (70, 30, 110), 80, 40),
                Table(
                    80,
                    140,
                    (300, 200, 360),
                    (
                        ("Day", "Room", "Topic"),
                        ("Monday", "B12", "Sampling"),
                        ("Tuesday", "C4", "Filters"),
                        ("Thursday", "A1", "Review"),
                    ),
                    "liberation-narrow-italic",
                    "liberation-sans-bold-italic",
                    30,
                    "zebra",
                    INK,
                    (0, 0, 0),
                    band=(226, 218, 244),
                ),
                _tb(
                    ["Rooms may change in week 7"],
                    "liberation-narrow-italic",
                    20,
                    (90, 70, 110),
                    80,
                    520,
                ),
            ),
        ),
        HardSlide(
            "quote_centered",
            (28, 32, 36),
            (
                _tb(
                    ["Measure twice,", "cut once."],
                    "dejavu-serif-condensed-italic",
                    60,
                    (240, 235, 220),
                    640,
                    200,
                    "center",
                    spacing=1.3,
                ),
                _tb(
                    ["Old workshop saying"],
                    "dejavu-serif-condensed-italic",
                    24,
                    (180, 175, 160),
                    1100,
                    460,
                    "right",
                ),
            ),
        ),
        HardSlide(
            "rules_table_budget",
            WHITE,
            (
                _tb(["Project budget"], "liberation-sans-bold-italic", 46, INK, 80, 40),
                Table(
                    80,
                    140,
                    (300, 220, 420),
                    (
                        ("Item", "Cost", "Notes"),
                        ("Cables", "240 EUR", "one spare set"),
                        ("Sensors", "1,150 EUR", "eight units"),
                        ("Travel", "600 EUR", "two site visits"),
                    ),
                    "free-sans-oblique",
                    "free-sans-bold-oblique",
                    28,
                    "rules",
                    INK,
                    (50, 50, 50),
                    right=(1,),
                ),
                _tb(
                    ["Prices include tax"],
                    "free-sans-oblique",
                    18,
                    (100, 100, 100),
                    80,
                    500,
                ),
            ),
        ),
        HardSlide(
            "agenda_dark",
            (15, 45, 60),
            (
                _tb(["Agenda"], "free-sans-bold-oblique", 56, (255, 220, 120), 100, 60),
                TextBlock(
                    ("Motivation", "Method", "Results", "Open questions"),
                    "dejavu-sans-extralight",
                    36,
                    (225, 240, 245),
                    150,
                    190,
                    bullet=(255, 220, 120),
                ),
                _tb(
                    ["Seminar on sensing, room 2.14, 10 am"],
                    "dejavu-sans-oblique",
                    16,
                    (160, 190, 200),
                    100,
                    660,
                ),
            ),
        ),
        HardSlide(
            "photos_captions_below",
            (246, 244, 238),
            (
                _tb(["Two samples"], "free-serif-bold", 46, INK, 640, 30, "center"),
                Photo((90, 110, 590, 470), seed=40021),
                Photo((690, 110, 1190, 470), seed=40022),
                _tb(["Sample A, day one"], "liberation-narrow-italic", 24, INK, 90, 490),
                _tb(["Sample B, day nine"], "liberation-narrow-italic", 24, INK, 690, 490),
            ),
        ),
    ]


FRESH_A = FreshSet(
    name="fresh-a",
    seed=40_000,
    topics=TOPICS_A,
    voices=[f"{ACCENTS[i % len(ACCENTS)]}+{v}" for i, v in enumerate(_VARIANTS_A)],
    slide_faces=[
        ("dejavu-sans-oblique", "dejavu-sans-bold-oblique"),
        ("liberation-narrow-italic", "liberation-sans-bold-italic"),
        ("free-sans-oblique", "free-serif-bold"),
        ("dejavu-sans-extralight", "free-sans-bold-oblique"),
        ("dejavu-serif-condensed-italic", "liberation-sans-bold-italic"),
        ("dejavu-mono-oblique", "free-mono-bold"),
    ],
    themes=[
        ((255, 255, 255), (0, 70, 35)),  # dark green on white
        ((232, 242, 252), (20, 50, 110)),  # navy on pale blue
        ((60, 20, 25), (250, 225, 170)),  # cream on maroon
        ((238, 238, 228), (120, 120, 110)),  # grey on off-white (low contrast)
        ((20, 70, 60), (205, 240, 228)),  # mint on dark teal
    ],
    layouts=[
        SlideLayout(640, 60, "center", 160, 210, "left"),
        SlideLayout(60, 40, "left", 90, 180, "left", bullet=(200, 120, 0)),
        SlideLayout(1220, 70, "right", 1220, 240, "right"),
        SlideLayout(120, 90, "left", 640, 280, "center"),
    ],
    ocr_slides=_ocr_slides_a(),
    redraws=16,
)

FRESH_SETS: dict[str, FreshSet] = {s.name: s for s in (FRESH_A,)}
FONTS.update(FRESH_FACES)


def check_drawable(fs: FreshSet) -> None:
    """Raise `AssetBuildError` unless every OCR slide renders and every speech slide fits in
    every layout, face and size the set may draw it with."""
    from PIL import Image, ImageDraw

    from make_demo_clip import _draw_block
    from make_ocr_hard_set import render

    for slide in fs.ocr_slides:
        render(slide)
    img = Image.new("RGB", (1280, 720))
    draw = ImageDraw.Draw(img)
    for topic in fs.topics.values():
        for title, *body in topic.slides:
            for lay in fs.layouts:
                for font, title_font in fs.slide_faces:
                    for size in (14, 30):  # the smallest and largest body size drawn
                        _draw_block(
                            draw,
                            TextBlock((title,), title_font, size + 14, WHITE, *_at(lay, "title")),
                        )
                        _draw_block(
                            draw,
                            TextBlock(
                                tuple(body), font, size, WHITE, *_at(lay, "body"), bullet=lay.bullet
                            ),
                        )


def _at(lay: SlideLayout, what: str) -> tuple[int, int, str]:
    if what == "title":
        return lay.title_x, lay.title_y, lay.title_align
    return lay.body_x, lay.body_y, lay.body_align
