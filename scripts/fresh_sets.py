"""Fresh test sets for the calibration benchmark (`benchmarks/calibration.py --split fresh-a`).

A fresh set is generated clips that differ from every clip the shipped calibrators were fitted,
chosen or scored on (the calibration fit clips, the OCR and speech sets' `dev`, `heldout` and
`fresh` splits, their redrawn and reseeded copies, the bundled lecture) on every axis the
generators offer:

- fonts: faces of the same Debian packages (fonts-dejavu-core and -extra, fonts-liberation,
  fonts-freefont-ttf, fonts-urw-base35)
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

_URW = "/usr/share/fonts/opentype/urw-base35/"  # absolute: FONT_DIR / it is itself

# Faces no generator names (same three Debian packages; fresh-c: fonts-urw-base35). Registered
# in FONTS here.
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
    # fresh-b's faces: none of the above
    "dejavu-sans-condensed-oblique": "dejavu/DejaVuSansCondensed-Oblique.ttf",
    "dejavu-sans-condensed-bold-oblique": "dejavu/DejaVuSansCondensed-BoldOblique.ttf",
    "dejavu-serif-bold-italic": "dejavu/DejaVuSerif-BoldItalic.ttf",
    "dejavu-serif-condensed-bold-italic": "dejavu/DejaVuSerifCondensed-BoldItalic.ttf",
    "dejavu-mono-bold-oblique": "dejavu/DejaVuSansMono-BoldOblique.ttf",
    "liberation-mono-italic": "liberation/LiberationMono-Italic.ttf",
    "liberation-mono-bold-italic": "liberation/LiberationMono-BoldItalic.ttf",
    "liberation-narrow-bold-italic": "liberation/LiberationSansNarrow-BoldItalic.ttf",
    "liberation-serif-bold-italic": "liberation/LiberationSerif-BoldItalic.ttf",
    "free-mono-oblique": "freefont/FreeMonoOblique.ttf",
    "free-serif-italic": "freefont/FreeSerifItalic.ttf",
    "free-serif-bold-italic": "freefont/FreeSerifBoldItalic.ttf",
    # fresh-c's faces: URW base35 (fonts-urw-base35) italics and obliques; the layout dev set
    # (scripts/make_layout_dev_set.py) draws with the upright faces of the same families
    "urw-sans-italic": _URW + "NimbusSans-Italic.otf",
    "urw-sans-bold-italic": _URW + "NimbusSans-BoldItalic.otf",
    "urw-narrow-oblique": _URW + "NimbusSansNarrow-Oblique.otf",
    "urw-narrow-bold-oblique": _URW + "NimbusSansNarrow-BoldOblique.otf",
    "urw-roman-italic": _URW + "NimbusRoman-Italic.otf",
    "urw-roman-bold-italic": _URW + "NimbusRoman-BoldItalic.otf",
    "urw-mono-italic": _URW + "NimbusMonoPS-Italic.otf",
    "urw-mono-bold-italic": _URW + "NimbusMonoPS-BoldItalic.otf",
    "urw-c059-italic": _URW + "C059-Italic.otf",
    "urw-c059-bold-italic": _URW + "C059-BdIta.otf",
    "urw-p052-italic": _URW + "P052-Italic.otf",
    "urw-p052-bold-italic": _URW + "P052-BoldItalic.otf",
    "urw-gothic-oblique": _URW + "URWGothic-BookOblique.otf",
    "urw-gothic-bold-oblique": _URW + "URWGothic-DemiOblique.otf",
    "urw-bookman-italic": _URW + "URWBookman-LightItalic.otf",
    "urw-bookman-bold-italic": _URW + "URWBookman-DemiItalic.otf",
    # fresh-d's faces: the last installed faces no generator names - FreeMono Bold Oblique, the
    # Latin letters of DejaVu Math TeX Gyre (a serif close in design to DejaVu Serif, which the
    # generators use) and URW Z003 (a chancery script)
    "free-mono-bold-oblique": "freefont/FreeMonoBoldOblique.ttf",
    "dejavu-math": "dejavu/DejaVuMathTeXGyre.ttf",
    "urw-z003-italic": _URW + "Z003-MediumItalic.otf",
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
            "four_quadrants",
            (255, 255, 255),
            (
                _tb(["Four steps"], "dejavu-sans-bold-oblique", 50, INK, 80, 40),
                _tb(["Collect"], "dejavu-sans-bold-oblique", 30, (0, 110, 90), 140, 170),
                _tb(
                    ["Record the room", "Note the time"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    140,
                    225,
                ),
                _tb(["Label"], "dejavu-sans-bold-oblique", 30, (0, 110, 90), 700, 170),
                _tb(
                    ["Mark each word", "Check twice"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    700,
                    225,
                ),
                _tb(["Train"], "dejavu-sans-bold-oblique", 30, (0, 110, 90), 140, 430),
                _tb(
                    ["Small model first", "Then scale up"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    140,
                    485,
                ),
                _tb(["Deploy"], "dejavu-sans-bold-oblique", 30, (0, 110, 90), 700, 430),
                _tb(
                    ["Watch the errors", "Keep the logs"],
                    "dejavu-sans-oblique",
                    24,
                    INK,
                    700,
                    485,
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

_VARIANTS_B = [
    "adam",
    "Andrea",
    "klatt4",
    "benjamin",
    "aunty",
    "boris",
    "shelby",
    "caleb",
    "steph2",
    "ed",
    "Alex",
    "edward2",
    "Jacky",
    "Gene2",
    "steph3",
    "Hugo",
    "Mike",
    "iven",
    "michel",
    "pablo",
    "robert",
    "victor",
    "iven2",
    "Denis",
]

TOPICS_B: dict[str, Topic] = {
    "tides": Topic(
        [
            ["Ocean tides", "gravitational pull of the moon", "spring and neap tides"],
            ["Ocean currents", "thermohaline circulation", "the Gulf Stream"],
        ],
        [
            "Tides follow the gravitational pull of the moon and the sun.",
            "Spring tides come when the sun and the moon line up.",
            "Thermohaline circulation is driven by differences in heat and salt.",
            "The Gulf Stream carries warm water across the Atlantic.",
        ],
    ),
    "memory": Topic(
        [
            ["Virtual memory", "page tables", "translation lookaside buffer"],
            ["Process scheduling", "round robin time slices", "priority inversion"],
        ],
        [
            "Every process sees its own address space through page tables.",
            "The translation lookaside buffer caches recent address translations.",
            "A round robin scheduler gives each process a short time slice.",
            "Priority inversion happens when a low priority task holds a lock.",
        ],
    ),
    "immunity": Topic(
        [
            ["The immune system", "antibodies from B cells", "memory T cells"],
            ["Vaccination", "weakened antigens", "herd immunity threshold"],
        ],
        [
            "B cells release antibodies that bind to a specific antigen.",
            "Memory T cells remember an infection for many years.",
            "A vaccine shows the body weakened antigens without the disease.",
            "Above the herd immunity threshold an outbreak dies out on its own.",
        ],
    ),
    "thermodynamics": Topic(
        [
            ["Thermodynamics", "conservation of energy", "entropy always increases"],
            ["Heat engines", "the Carnot cycle", "refrigerators and heat pumps"],
        ],
        [
            "The first law is simply the conservation of energy.",
            "In an isolated system, entropy always increases over time.",
            "No engine can beat the efficiency of the Carnot cycle.",
            "Refrigerators and heat pumps move heat from cold to hot.",
        ],
    ),
    "harmony": Topic(
        [
            ["Music theory", "major and minor scales", "intervals and chords"],
            ["Harmony", "dominant seventh", "cadences at the end of a phrase"],
        ],
        [
            "Major and minor scales differ in the position of their half steps.",
            "Stacking intervals of a third gives the common chords.",
            "A dominant seventh chord pulls strongly towards the tonic.",
            "Cadences mark the end of a musical phrase.",
        ],
    ),
    "epidemics": Topic(
        [
            ["Epidemic models", "susceptible, infected, recovered", "basic reproduction number"],
            ["Tracking outbreaks", "contact tracing", "incubation period"],
        ],
        [
            "The simplest epidemic model splits people into susceptible, infected and recovered.",
            "The basic reproduction number counts new cases caused by one case.",
            "Contact tracing finds the people an infected person has met.",
            "The incubation period is the time from infection to the first symptoms.",
        ],
    ),
}


def _ocr_slides_b() -> list[HardSlide]:
    return [
        HardSlide(
            "grid_table_trains",
            (255, 253, 245),
            (
                _tb(["Departures"], "liberation-serif-bold-italic", 50, INK, 80, 40),
                Table(
                    80,
                    140,
                    (200, 340, 160, 200),
                    (
                        ("Time", "Destination", "Track", "Status"),
                        ("08:15", "Harbour Road", "4", "on time"),
                        ("08:32", "Airport", "1", "delayed"),
                        ("08:47", "North Park", "7", "on time"),
                    ),
                    "free-serif-italic",
                    "free-serif-bold-italic",
                    28,
                    "grid",
                    INK,
                    (110, 100, 80),
                    right=(2,),
                ),
            ),
        ),
        HardSlide(
            "code_dark_loop",
            (22, 26, 34),
            (
                _tb(
                    ["Retry with backoff"], "dejavu-sans-condensed-bold-oblique", 44, WHITE, 80, 40
                ),
                _tb(
                    [
                        "delay = 0.5",
                        "for attempt in range(5):",
                        "    if send(msg):",
                        "        break",
                        "    sleep(delay)",
                        "    delay *= 2",
                    ],
                    "liberation-mono-italic",
                    26,
                    (250, 200, 120),
                    110,
                    150,
                    spacing=1.5,
                ),
            ),
        ),
        HardSlide(
            "photo_full_caption",
            (240, 240, 240),
            (
                Photo(
                    (0, 0, 1280, 520),
                    seed=41011,
                    text=("Night market, old town",),
                    font="dejavu-sans-condensed-bold-oblique",
                    size_px=40,
                    banner=False,
                ),
                _tb(
                    ["Figure 2: stalls lit by strings of lamps"],
                    "dejavu-sans-condensed-oblique",
                    22,
                    (60, 60, 60),
                    80,
                    560,
                ),
            ),
        ),
        HardSlide(
            "two_columns_pros_cons",
            (236, 246, 238),
            (
                _tb(["Batch or stream"], "dejavu-serif-bold-italic", 48, (20, 80, 40), 80, 40),
                _tb(["Batch"], "dejavu-serif-bold-italic", 30, (20, 80, 40), 160, 200),
                _tb(
                    ["Simple to reason about", "High throughput"],
                    "dejavu-serif-condensed-bold-italic",
                    26,
                    INK,
                    160,
                    260,
                ),
                _tb(["Stream"], "dejavu-serif-bold-italic", 30, (20, 80, 40), 760, 200),
                _tb(
                    ["Answers within seconds", "State must be kept"],
                    "dejavu-serif-condensed-bold-italic",
                    26,
                    INK,
                    760,
                    260,
                ),
            ),
        ),
        HardSlide(
            "zebra_table_grades",
            WHITE,
            (
                _tb(["Marks by task"], "liberation-narrow-bold-italic", 48, INK, 640, 40, "center"),
                Table(
                    290,
                    140,
                    (300, 180, 220),
                    (
                        ("Task", "Weight", "Mean"),
                        ("Essay", "40 %", "68"),
                        ("Lab report", "35 %", "74"),
                        ("Quiz", "25 %", "81"),
                    ),
                    "liberation-narrow-bold-italic",
                    "liberation-narrow-bold-italic",
                    30,
                    "zebra",
                    INK,
                    (0, 0, 0),
                    band=(255, 236, 200),
                    right=(1, 2),
                ),
            ),
        ),
        HardSlide(
            "terminal_output",
            (0, 0, 0),
            (
                _tb(
                    [
                        "$ make test",
                        "collected 212 items",
                        "210 passed, 2 skipped in 41.3s",
                    ],
                    "dejavu-mono-bold-oblique",
                    26,
                    (120, 230, 120),
                    80,
                    120,
                    spacing=1.6,
                ),
                _tb(["Console"], "free-mono-oblique", 20, (160, 160, 160), 1200, 660, "right"),
            ),
        ),
        HardSlide(
            "rules_table_chem",
            (248, 250, 255),
            (
                _tb(["Melting points"], "free-serif-bold-italic", 50, (30, 30, 90), 80, 40),
                Table(
                    80,
                    140,
                    (300, 260),
                    (
                        ("Metal", "Melting point"),
                        ("Tin", "232 C"),
                        ("Lead", "327 C"),
                        ("Copper", "1085 C"),
                        ("Iron", "1538 C"),
                    ),
                    "free-serif-italic",
                    "free-serif-bold-italic",
                    28,
                    "rules",
                    INK,
                    (40, 40, 90),
                    right=(1,),
                ),
            ),
        ),
        HardSlide(
            "title_subtitle_orange",
            (200, 90, 20),
            (
                _tb(["Week 11"], "liberation-serif-bold-italic", 72, WHITE, 640, 160, "center"),
                _tb(
                    ["Sorting in linear time"],
                    "liberation-serif-bold-italic",
                    40,
                    (255, 235, 210),
                    640,
                    290,
                    "center",
                ),
                _tb(
                    ["Counting sort, radix sort"],
                    "free-mono-oblique",
                    24,
                    WHITE,
                    640,
                    420,
                    "center",
                ),
            ),
        ),
        HardSlide(
            "three_photos_labels",
            (30, 30, 30),
            (
                Photo(
                    (60, 80, 420, 420),
                    seed=41021,
                    text=("Spring",),
                    font="liberation-mono-bold-italic",
                    size_px=28,
                ),
                Photo(
                    (460, 80, 820, 420),
                    seed=41022,
                    text=("Summer",),
                    font="liberation-mono-bold-italic",
                    size_px=28,
                ),
                Photo(
                    (860, 80, 1220, 420),
                    seed=41023,
                    text=("Autumn",),
                    font="liberation-mono-bold-italic",
                    size_px=28,
                ),
                _tb(
                    ["One site photographed every three months"],
                    "dejavu-sans-condensed-oblique",
                    22,
                    (200, 200, 200),
                    640,
                    480,
                    "center",
                ),
            ),
        ),
    ]


FRESH_B = FreshSet(
    name="fresh-b",
    seed=41_000,
    topics=TOPICS_B,
    voices=[f"{ACCENTS[(i + 3) % len(ACCENTS)]}+{v}" for i, v in enumerate(_VARIANTS_B)],
    slide_faces=[
        ("dejavu-sans-condensed-oblique", "dejavu-sans-condensed-bold-oblique"),
        ("free-serif-italic", "free-serif-bold-italic"),
        ("liberation-mono-italic", "liberation-mono-bold-italic"),
        ("dejavu-serif-condensed-bold-italic", "dejavu-serif-bold-italic"),
        ("liberation-narrow-bold-italic", "liberation-serif-bold-italic"),
        ("free-mono-oblique", "dejavu-mono-bold-oblique"),
    ],
    themes=[
        ((250, 250, 235), (60, 40, 10)),  # dark brown on ivory
        ((10, 10, 10), (255, 230, 0)),  # yellow on black
        ((225, 235, 225), (30, 90, 50)),  # green on pale green
        ((90, 40, 110), (245, 235, 250)),  # lilac on purple
        ((245, 245, 250), (160, 160, 175)),  # pale grey on white (low contrast)
    ],
    layouts=[
        SlideLayout(640, 40, "center", 640, 200, "center"),
        SlideLayout(100, 120, "left", 140, 260, "left", bullet=(0, 120, 200)),
        SlideLayout(60, 560, "left", 60, 200, "left"),
        SlideLayout(1200, 40, "right", 80, 220, "left"),
    ],
    ocr_slides=_ocr_slides_b(),
    redraws=16,
)

_VARIANTS_C = [
    "antonio",
    "Diogo",
    "gustave",
    "Henrique",
    "iven3",
    "iven4",
    "kaukovalta",
    "marcelo",
    "Marco",
    "Mario",
    "miguel",
    "Nguyen",
    "pedro",
    "RicishayMax",
    "RicishayMax2",
    "RicishayMax3",
    "sandro",
    "klatt5",
    "klatt6",
    "anika",
    "Storm",
    "croak",
    "AnxiousAndy",
    "Tweaky",
]

TOPICS_C: dict[str, Topic] = {
    "glassmaking": Topic(
        [
            ["Making glass", "silica sand and soda ash", "annealing in a lehr"],
            ["Float glass", "molten tin bath", "tempered safety panes"],
        ],
        [
            "Glass starts as silica sand melted together with soda ash and lime.",
            "Annealing in a lehr lets the glass cool without internal stress.",
            "Float glass spreads over a bath of molten tin to become perfectly flat.",
            "Tempered safety panes break into small blunt pieces.",
        ],
    ),
    "hashing": Topic(
        [
            ["Hash tables", "open addressing", "load factor and resizing"],
            ["Collisions", "separate chaining", "cuckoo hashing"],
        ],
        [
            "A hash table maps each key to a bucket through a hash function.",
            "Open addressing probes the next free slot after a collision.",
            "When the load factor grows too high the table doubles its size.",
            "Cuckoo hashing moves an old key to its second home on a clash.",
        ],
    ),
    "bees": Topic(
        [
            ["Honey bee colonies", "queen, workers and drones", "the waggle dance"],
            ["Pollination", "nectar and pollen baskets", "colony collapse disorder"],
        ],
        [
            "A colony has one queen, thousands of workers and a few drones.",
            "With the waggle dance a forager tells others where the flowers are.",
            "Workers carry pollen home in baskets on their hind legs.",
            "Colony collapse disorder empties a hive within a few weeks.",
        ],
    ),
    "bridges": Topic(
        [
            ["Bridge design", "suspension cables in tension", "concrete piers in compression"],
            ["Failure modes", "wind induced resonance", "fatigue cracks in steel"],
        ],
        [
            "The deck of a suspension bridge hangs from cables in tension.",
            "Concrete piers carry the weight down to the riverbed in compression.",
            "Wind induced resonance once tore a famous bridge apart.",
            "Fatigue cracks in steel grow a little with every passing truck.",
        ],
    ),
    "inflation": Topic(
        [
            ["Inflation", "consumer price index", "central bank interest rates"],
            ["Money supply", "quantitative easing", "wage price spiral"],
        ],
        [
            "The consumer price index tracks the cost of a basket of goods.",
            "Central bank interest rates rise when inflation runs too fast.",
            "Quantitative easing buys bonds to push money into the economy.",
            "In a wage price spiral, higher pay and higher prices chase each other.",
        ],
    ),
    "telescopes": Topic(
        [
            ["Optical telescopes", "primary mirror aperture", "adaptive optics"],
            ["Radio astronomy", "dish interferometry", "the cosmic microwave background"],
        ],
        [
            "A larger primary mirror aperture gathers more faint light.",
            "Adaptive optics bends a thin mirror to cancel the twinkle of the air.",
            "Dish interferometry links distant antennas into one huge telescope.",
            "The cosmic microwave background is the oldest light we can see.",
        ],
    ),
}


def _ocr_slides_c() -> list[HardSlide]:
    return [
        HardSlide(
            "plain_table_bus_fares",
            (252, 252, 247),
            (
                _tb(["Bus fares"], "urw-gothic-bold-oblique", 48, INK, 100, 50),
                Table(  # no rules, no bands: a table only its alignment shows
                    100,
                    150,
                    (330, 170, 190),
                    (
                        ("Ticket", "Zones", "Price"),
                        ("Single", "1", "2.40"),
                        ("Day pass", "1-3", "7.90"),
                        ("Weekly", "all", "31.00"),
                    ),
                    "urw-gothic-oblique",
                    "urw-gothic-bold-oblique",
                    28,
                    "zebra",
                    INK,
                    (0, 0, 0),
                    band=(252, 252, 247),
                    right=(2,),
                ),
            ),
        ),
        HardSlide(
            "code_light_counter",
            (248, 248, 240),
            (
                _tb(["Count the words"], "urw-sans-bold-italic", 42, (40, 40, 120), 70, 36),
                _tb(
                    [
                        "counts = {}",
                        "for w in text.split():",
                        "    counts[w] = counts.get(w, 0) + 1",
                        "total += len(counts)",
                        "print(f'{total} words')",
                    ],
                    "urw-mono-italic",
                    26,
                    (30, 30, 30),
                    90,
                    140,
                    spacing=1.55,
                ),
            ),
        ),
        HardSlide(
            "two_columns_then_now",
            (240, 244, 252),
            (
                _tb(["Then and now"], "urw-p052-bold-italic", 46, (20, 40, 100), 640, 36, "center"),
                _tb(["Then"], "urw-p052-bold-italic", 30, (20, 40, 100), 130, 170),
                _tb(
                    ["Letters took a week", "One phone per house"],
                    "urw-p052-italic",
                    26,
                    INK,
                    130,
                    230,
                ),
                _tb(["Now"], "urw-p052-bold-italic", 30, (20, 40, 100), 700, 170),
                _tb(
                    ["Messages arrive at once", "A phone in every pocket"],
                    "urw-p052-italic",
                    26,
                    INK,
                    700,
                    230,
                ),
            ),
        ),
        HardSlide(
            "quadrants_seasons_work",
            (255, 250, 240),
            (
                _tb(["A year on the farm"], "urw-bookman-bold-italic", 42, INK, 70, 30),
                _tb(["Sow"], "urw-bookman-bold-italic", 28, (120, 70, 0), 150, 150),
                _tb(
                    ["Plough the field", "Plant the seed"], "urw-bookman-italic", 22, INK, 150, 200
                ),
                _tb(["Tend"], "urw-bookman-bold-italic", 28, (120, 70, 0), 720, 150),
                _tb(["Pull the weeds", "Water at dusk"], "urw-bookman-italic", 22, INK, 720, 200),
                _tb(["Reap"], "urw-bookman-bold-italic", 28, (120, 70, 0), 150, 410),
                _tb(["Cut the wheat", "Stack the bales"], "urw-bookman-italic", 22, INK, 150, 460),
                _tb(["Rest"], "urw-bookman-bold-italic", 28, (120, 70, 0), 720, 410),
                _tb(
                    ["Mend the fences", "Plan next spring"], "urw-bookman-italic", 22, INK, 720, 460
                ),
            ),
        ),
        HardSlide(
            "two_photos_side_captions",
            (245, 245, 245),
            (
                Photo((90, 110, 610, 450), seed=42011),
                Photo((670, 110, 1190, 450), seed=42012),
                _tb(["Glacier in 1990"], "urw-c059-italic", 24, INK, 350, 480, "center"),
                _tb(["Glacier in 2020"], "urw-c059-italic", 24, INK, 930, 480, "center"),
            ),
        ),
        HardSlide(
            "rules_table_planets",
            (250, 250, 250),
            (
                _tb(
                    ["Moons per planet"],
                    "urw-roman-bold-italic",
                    48,
                    (60, 20, 20),
                    640,
                    40,
                    "center",
                ),
                Table(
                    320,
                    150,
                    (320, 160, 160),
                    (
                        ("Planet", "Moons", "Rings"),
                        ("Mars", "2", "no"),
                        ("Jupiter", "95", "yes"),
                        ("Saturn", "146", "yes"),
                        ("Neptune", "16", "yes"),
                    ),
                    "urw-roman-italic",
                    "urw-roman-bold-italic",
                    28,
                    "rules",
                    INK,
                    (90, 40, 40),
                    right=(1,),
                ),
            ),
        ),
        HardSlide(
            "title_slide_teal",
            (0, 110, 120),
            (
                _tb(["Unit 4"], "urw-narrow-bold-oblique", 70, WHITE, 120, 200),
                _tb(["Graphs and shortest paths"], "urw-narrow-bold-oblique", 42, WHITE, 120, 310),
                _tb(["Dijkstra, Bellman-Ford, A*"], "urw-mono-bold-italic", 24, WHITE, 120, 440),
            ),
        ),
        HardSlide(
            "grid_table_shifts",
            (255, 255, 255),
            (
                _tb(["Lab rota"], "urw-sans-bold-italic", 46, INK, 60, 30),
                Table(
                    60,
                    120,
                    (220, 260, 260, 240),
                    (
                        ("Day", "Morning", "Afternoon", "Room"),
                        ("Monday", "Priya", "Tomasz", "B12"),
                        ("Tuesday", "Ines", "Priya", "B14"),
                        ("Friday", "Tomasz", "Ines", "C3"),
                    ),
                    "urw-sans-italic",
                    "urw-sans-bold-italic",
                    26,
                    "grid",
                    INK,
                    (60, 60, 60),
                ),
            ),
        ),
        HardSlide(
            "photo_banner_and_list",
            (30, 34, 44),
            (
                Photo(
                    (60, 60, 620, 460),
                    seed=42021,
                    text=("Harbour at dawn",),
                    font="urw-c059-bold-italic",
                    size_px=32,
                ),
                _tb(
                    ["Boats leave at five", "Nets are mended by noon", "The market opens at six"],
                    "urw-c059-italic",
                    26,
                    (230, 230, 230),
                    680,
                    120,
                    spacing=1.8,
                ),
            ),
        ),
    ]


FRESH_C = FreshSet(
    name="fresh-c",
    seed=42_000,
    topics=TOPICS_C,
    voices=[f"{ACCENTS[(i + 5) % len(ACCENTS)]}+{v}" for i, v in enumerate(_VARIANTS_C)],
    slide_faces=[
        ("urw-sans-italic", "urw-sans-bold-italic"),
        ("urw-roman-italic", "urw-roman-bold-italic"),
        ("urw-gothic-oblique", "urw-gothic-bold-oblique"),
        ("urw-bookman-italic", "urw-bookman-bold-italic"),
        ("urw-narrow-oblique", "urw-p052-bold-italic"),
        ("urw-mono-italic", "urw-c059-bold-italic"),
    ],
    themes=[
        ((255, 248, 235), (90, 30, 60)),  # plum on cream
        ((15, 25, 45), (150, 220, 255)),  # sky blue on midnight
        ((235, 245, 250), (0, 90, 100)),  # teal on ice
        ((70, 70, 70), (250, 250, 250)),  # white on charcoal
        ((250, 250, 245), (185, 175, 160)),  # beige on white (low contrast)
    ],
    layouts=[
        SlideLayout(640, 80, "center", 640, 230, "center", bullet=(180, 40, 40)),
        SlideLayout(80, 50, "left", 120, 190, "left", bullet=(40, 140, 60)),
        SlideLayout(1180, 90, "right", 200, 260, "left"),
        SlideLayout(100, 30, "left", 1180, 200, "right"),
    ],
    ocr_slides=_ocr_slides_c(),
    redraws=16,
)

_VARIANTS_D = [  # the espeak-ng variants left that sound unlike every voice used before
    "Demonic",
    "UniRobot",
    "anikaRobot",
    "announcer",
    "robosoft",
    "robosoft2",
    "robosoft3",
    "robosoft4",
    "robosoft5",
    "robosoft6",
    "robosoft7",
    "robosoft8",
    "whisper",
    "whisperf",
]

TOPICS_D: dict[str, Topic] = {
    "coral_reefs": Topic(
        [
            ["Coral reefs", "polyps and their algae", "calcium carbonate skeletons"],
            ["Reef bleaching", "warm water stress", "slow recovery of the reef"],
        ],
        [
            "Each coral polyp lives together with tiny algae inside its tissue.",
            "The polyps build calcium carbonate skeletons layer by layer.",
            "Warm water stress makes the coral push its algae out and turn white.",
            "The slow recovery of the reef can take a decade or more.",
        ],
    ),
    "garbage_collection": Topic(
        [
            ["Garbage collection", "mark and sweep", "reachable objects"],
            ["Generational collectors", "the young generation", "stop the world pauses"],
        ],
        [
            "A mark and sweep collector first marks every reachable object.",
            "Whatever the marking phase never touched is swept away afterwards.",
            "Most objects die young, so the young generation is collected often.",
            "Concurrent collectors try to keep stop the world pauses short.",
        ],
    ),
    "wind_turbines": Topic(
        [
            ["Wind turbines", "blade pitch control", "gearbox and generator"],
            ["Wind farms", "wake losses downstream", "offshore foundations"],
        ],
        [
            "Blade pitch control turns the blades to limit speed in a storm.",
            "The gearbox and generator sit in the nacelle at the top of the tower.",
            "Wake losses downstream mean turbines must stand well apart.",
            "Offshore foundations are driven deep into the seabed.",
        ],
    ),
    "printing_press": Topic(
        [
            ["The printing press", "movable metal type", "oil based ink"],
            ["Spread of books", "cheaper pamphlets", "standard spelling"],
        ],
        [
            "Movable metal type let a printer reuse letters for every page.",
            "Oil based ink stuck to metal far better than the older water inks.",
            "Cheaper pamphlets carried new ideas across whole countries.",
            "Printed books slowly pushed writers toward a standard spelling.",
        ],
    ),
    "sleep": Topic(
        [
            ["The science of sleep", "rapid eye movement", "circadian rhythm"],
            ["Sleep and memory", "slow wave sleep", "effects of caffeine"],
        ],
        [
            "Most vivid dreams happen during rapid eye movement sleep.",
            "The circadian rhythm follows daylight through a small clock in the brain.",
            "During slow wave sleep the brain replays what it learned that day.",
            "The effects of caffeine can last for six hours after a cup.",
        ],
    ),
    "sorting": Topic(
        [
            ["Sorting algorithms", "merge sort", "quicksort partitions"],
            ["Sorting in practice", "stable ordering", "radix sort on integers"],
        ],
        [
            "Merge sort splits the list in half and merges the sorted halves.",
            "Quicksort partitions the list around a pivot value.",
            "A stable ordering keeps equal keys in the order they arrived.",
            "Radix sort on integers looks at one digit at a time.",
        ],
    ),
}


def _ocr_slides_d() -> list[HardSlide]:
    return [
        HardSlide(
            "plain_table_ferry_times",
            (250, 252, 255),
            (
                _tb(["Ferry times"], "dejavu-math", 46, INK, 88, 44),
                Table(  # no rules, no bands, a right-aligned last column
                    88,
                    146,
                    (300, 200, 170),
                    (
                        ("Crossing", "Leaves", "Minutes"),
                        ("Harbour to isle", "07:15", "35"),
                        ("Isle to point", "09:40", "20"),
                        ("Point to harbour", "12:05", "55"),
                    ),
                    "dejavu-math",
                    "dejavu-math",
                    27,
                    "zebra",
                    INK,
                    (0, 0, 0),
                    band=(250, 252, 255),
                    right=(2,),
                ),
            ),
        ),
        HardSlide(
            "code_dark_retry_budget",
            (24, 26, 30),
            (
                _tb(["Bounded retries"], "dejavu-math", 40, (240, 200, 120), 64, 34),
                _tb(
                    [
                        "left = budget[key]",
                        "while left > 0 and not ok:",
                        "    ok = send(msg); left -= 1",
                        "log.warn('gave up: %s', key)",
                        "return {'sent': ok}",
                    ],
                    "free-mono-bold-oblique",
                    25,
                    (220, 220, 220),
                    76,
                    132,
                    spacing=1.6,
                ),
            ),
        ),
        HardSlide(
            "two_columns_paper_screen",
            (252, 246, 238),
            (
                _tb(["Paper or screen"], "urw-z003-italic", 50, (90, 30, 20), 644, 26, "center"),
                _tb(["On paper"], "dejavu-math", 30, (90, 30, 20), 150, 160),
                _tb(
                    ["Needs no battery", "Easy to scribble on"],
                    "dejavu-math",
                    25,
                    INK,
                    150,
                    222,
                ),
                _tb(["On screen"], "dejavu-math", 30, (90, 30, 20), 690, 160),
                _tb(
                    ["Search in a second", "Shared with anyone"],
                    "dejavu-math",
                    25,
                    INK,
                    690,
                    222,
                ),
            ),
        ),
        HardSlide(
            "quadrants_kitchen_roles",
            (244, 250, 244),
            (
                _tb(["Who does what"], "dejavu-math", 42, INK, 84, 26),
                _tb(["Chef"], "dejavu-math", 27, (0, 90, 60), 160, 140),
                _tb(["Plans the menu", "Tastes every sauce"], "dejavu-math", 22, INK, 160, 188),
                _tb(["Baker"], "dejavu-math", 27, (0, 90, 60), 700, 140),
                _tb(["Proves the dough", "Bakes before dawn"], "dejavu-math", 22, INK, 700, 188),
                _tb(["Porter"], "dejavu-math", 27, (0, 90, 60), 160, 420),
                _tb(["Washes the pans", "Carries the crates"], "dejavu-math", 22, INK, 160, 468),
                _tb(["Waiter"], "dejavu-math", 27, (0, 90, 60), 700, 420),
                _tb(["Takes the orders", "Clears the tables"], "dejavu-math", 22, INK, 700, 468),
            ),
        ),
        HardSlide(
            "two_photos_captions_river",
            (238, 238, 238),
            (
                Photo((80, 100, 600, 440), seed=43011),
                Photo((680, 100, 1200, 440), seed=43012),
                _tb(["River in spring"], "dejavu-math", 24, INK, 340, 470, "center"),
                _tb(["River in autumn"], "dejavu-math", 24, INK, 940, 470, "center"),
            ),
        ),
        HardSlide(
            "rules_table_rainfall",
            (252, 252, 252),
            (
                _tb(["Rainfall by month"], "urw-z003-italic", 50, (20, 50, 90), 644, 30, "center"),
                Table(
                    300,
                    140,
                    (300, 170, 170),
                    (
                        ("Month", "mm", "Days"),
                        ("March", "48", "11"),
                        ("June", "62", "9"),
                        ("September", "71", "13"),
                        ("December", "85", "17"),
                    ),
                    "dejavu-math",
                    "dejavu-math",
                    27,
                    "rules",
                    INK,
                    (40, 60, 90),
                    right=(1, 2),
                ),
            ),
        ),
        HardSlide(
            "title_slide_plum",
            (80, 30, 70),
            (
                _tb(["Week 9"], "urw-z003-italic", 72, WHITE, 130, 190),
                _tb(["Heaps and priority queues"], "dejavu-math", 40, WHITE, 130, 300),
                _tb(["push, pop, decrease-key"], "free-mono-bold-oblique", 24, WHITE, 130, 430),
            ),
        ),
        HardSlide(
            "grid_table_library",
            (255, 255, 255),
            (
                _tb(["Library hours"], "dejavu-math", 44, INK, 64, 28),
                Table(
                    64,
                    116,
                    (230, 250, 250, 230),
                    (
                        ("Branch", "Opens", "Closes", "Floor"),
                        ("Central", "08:30", "20:00", "G"),
                        ("Riverside", "10:00", "18:00", "1"),
                        ("Hillcrest", "09:00", "17:30", "2"),
                    ),
                    "dejavu-math",
                    "dejavu-math",
                    26,
                    "grid",
                    INK,
                    (70, 70, 70),
                ),
            ),
        ),
        HardSlide(
            "photo_banner_and_notes",
            (36, 40, 36),
            (
                Photo(
                    (70, 70, 630, 470),
                    seed=43021,
                    text=("Orchard in May",),
                    font="dejavu-math",
                    size_px=32,
                ),
                _tb(
                    ["Blossom opens first", "Bees visit at midday", "Fruit sets in June"],
                    "dejavu-math",
                    26,
                    (232, 232, 232),
                    690,
                    130,
                    spacing=1.8,
                ),
            ),
        ),
    ]


FRESH_D = FreshSet(
    name="fresh-d",
    seed=43_000,
    topics=TOPICS_D,
    voices=[f"{ACCENTS[(i + 2) % len(ACCENTS)]}+{v}" for i, v in enumerate(_VARIANTS_D)],
    slide_faces=[
        ("dejavu-math", "urw-z003-italic"),
        ("urw-z003-italic", "dejavu-math"),
        ("free-mono-bold-oblique", "dejavu-math"),
    ],
    themes=[
        ((240, 236, 250), (70, 20, 120)),  # violet on lavender
        ((20, 40, 30), (210, 250, 200)),  # mint on dark green
        ((255, 240, 240), (150, 20, 30)),  # crimson on blush
        ((40, 30, 20), (255, 200, 140)),  # apricot on dark brown
        ((248, 252, 248), (170, 190, 170)),  # sage on white (low contrast)
    ],
    layouts=[
        SlideLayout(640, 60, "center", 200, 220, "left"),
        SlideLayout(90, 70, "left", 640, 250, "center", bullet=(200, 120, 0)),
        SlideLayout(1190, 60, "right", 1190, 230, "right"),
        SlideLayout(640, 540, "center", 110, 170, "left", bullet=(90, 90, 200)),
    ],
    ocr_slides=_ocr_slides_d(),
    redraws=16,
)

FRESH_SETS: dict[str, FreshSet] = {s.name: s for s in (FRESH_A, FRESH_B, FRESH_C, FRESH_D)}
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
