// The small text the tiny-model generator trains its byte-level BPE tokenizer on. Plain English
// prose on everyday subjects plus a few lines in other scripts so multi-byte characters and emoji
// get merges of their own. Changing it changes every generated tokenizer (and the golden files).

export const TRAINING_CORPUS = `The morning train left the station a few minutes late, and nobody seemed to mind.
People read the news, looked out of the window, or closed their eyes for a while.
A small dog sat under one of the seats and watched the shoes of the passengers.
When the train crossed the river, the light on the water was bright and silver.

The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
The capital of Spain is Madrid, and the capital of Japan is Tokyo.
Paris is known for its museums, its cafes and the long walks along the river Seine.
Many visitors come to the city in the spring, when the trees along the streets are green.

A good recipe for bread needs only flour, water, salt and a little yeast.
Mix the flour and the water, add the salt, and let the dough rest for an hour.
Then fold it, shape it into a round loaf, and bake it in a hot oven until the crust is brown.
The kitchen will smell of warm bread, and the neighbours may knock on the door to ask for a slice.

Computers store numbers as bits. Eight bits make a byte, and a byte can hold a value from 0 to 255.
A program reads input, does some work, and writes output. When it fails, it should say why.
Good error messages tell the user what went wrong and what to do next.
The server answered the request in 12 milliseconds, then waited for the next one.
Memory is fast, disks are slower, and the network is slower still, so we measure before we guess.

The weather today is cool and clear. Tomorrow there may be rain in the afternoon.
In the north of the country the first snow has already fallen on the hills.
Farmers watch the sky, because a late frost can ruin a whole season of work.

She opened the old book and found a letter between the pages.
The letter was written in blue ink, and the handwriting was small and careful.
"Dear friend," it began, "I hope this finds you well, and that the garden is still growing."
He smiled when he read it, because he remembered the garden and the long summer evenings.

Water boils at 100 degrees Celsius at sea level, and it freezes at 0 degrees.
The sun is a star, and the earth moves around it once a year.
The moon has no light of its own; it reflects the light of the sun.
There are seven days in a week, twelve months in a year, and sixty minutes in an hour.

Question: What is the largest planet in our solar system?
Answer: The largest planet is Jupiter.
Question: How many legs does a spider have?
Answer: A spider has eight legs.
Question: What colour is the sky on a clear day?
Answer: The sky is blue on a clear day.

user: Can you help me write a short note to my team?
assistant: Of course. Here is a short note you could send to your team today.
user: Thank you, that is very helpful.
assistant: You are welcome. Let me know if you would like to change anything.

The library was quiet except for the sound of pages turning and the soft hum of the lights.
Children sat on the carpet and listened to a story about a brave little boat.
The boat sailed across the sea, through wind and waves, to find an island full of birds.
At the end of the story everyone clapped, and the children asked to hear it again.

Running every day is good for the heart, but rest days matter as well.
Drink enough water, sleep enough hours, and eat fruit and vegetables with every meal.
A short walk after dinner helps you sleep better and clears the mind.

안녕하세요. 오늘 날씨가 정말 좋네요. 한국어 문장도 조금 넣어 둡니다.
서울은 한국의 수도입니다. 감사합니다!
こんにちは、世界。東京は日本の首都です。今日はいい天気ですね。
你好，世界。北京是中国的首都。
Bonjour le monde ! La capitale de la France est Paris. Ça va très bien, merci.
Guten Tag! Die Hauptstadt von Deutschland ist Berlin. Schöne Grüße aus München.
¡Hola! ¿Qué tal? La capital de España es Madrid.
Привет, мир! Столица России — Москва.
Emoji also appear in text now: 🙂 👍 🎉 🚀 ❤️ ☕ 🌧️ 🇫🇷
`;
