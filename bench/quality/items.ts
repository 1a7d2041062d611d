// A fixed multiple-choice set for `pnpm bench quality`: a context and candidate continuations,
// scored by their log-likelihood as evaluation harnesses score (the sum of the continuation's
// token log-probabilities given the context). Written for this bench: short general-knowledge and
// common-sense cloze items that a 135M instruct model gets right more often than chance. `answer`
// is the index of the right continuation.
export interface ChoiceItem {
  context: string;
  choices: string[];
  answer: number;
}

export const ITEMS: ChoiceItem[] = [
  { context: "The capital of France is", choices: [" Paris", " London", " Berlin", " Madrid"], answer: 0 },
  { context: "The capital of Japan is", choices: [" Beijing", " Tokyo", " Seoul", " Bangkok"], answer: 1 },
  { context: "The capital of Italy is", choices: [" Rome", " Vienna", " Athens", " Lisbon"], answer: 0 },
  { context: "The largest planet in the solar system is", choices: [" Mars", " Venus", " Jupiter", " Mercury"], answer: 2 },
  { context: "Water freezes at a temperature of zero degrees", choices: [" Celsius", " Kelvin", " per hour", " north"], answer: 0 },
  { context: "A week has seven", choices: [" days", " months", " years", " hours"], answer: 0 },
  { context: "The sun rises in the", choices: [" east", " west", " basement", " ocean"], answer: 0 },
  { context: "Bees make", choices: [" honey", " milk", " glass", " steel"], answer: 0 },
  { context: "The opposite of hot is", choices: [" cold", " loud", " tall", " fast"], answer: 0 },
  { context: "The opposite of up is", choices: [" down", " left", " green", " early"], answer: 0 },
  { context: "Two plus two equals", choices: [" four", " seven", " ten", " one"], answer: 0 },
  { context: "Ten minus three equals", choices: [" seven", " twelve", " two", " thirty"], answer: 0 },
  { context: "There are twelve months in a", choices: [" year", " week", " day", " minute"], answer: 0 },
  { context: "A baby cat is called a", choices: [" kitten", " puppy", " calf", " chick"], answer: 0 },
  { context: "A baby dog is called a", choices: [" puppy", " kitten", " lamb", " foal"], answer: 0 },
  { context: "Fish live in", choices: [" water", " trees", " deserts", " clouds"], answer: 0 },
  { context: "The color of the clear daytime sky is", choices: [" blue", " purple", " black", " brown"], answer: 0 },
  { context: "Grass is usually", choices: [" green", " red", " white", " orange"], answer: 0 },
  { context: "People use an umbrella when it", choices: [" rains", " sleeps", " sings", " reads"], answer: 0 },
  { context: "To see in the dark, you can turn on a", choices: [" light", " sandwich", " carpet", " spoon"], answer: 0 },
  { context: "The Earth goes around the", choices: [" Sun", " Moon", " Mars", " comet"], answer: 0 },
  { context: "Ice is frozen", choices: [" water", " sand", " bread", " metal"], answer: 0 },
  { context: "A triangle has three", choices: [" sides", " wheels", " legs", " colors"], answer: 0 },
  { context: "Doctors work in a", choices: [" hospital", " volcano", " submarine", " bakery"], answer: 0 },
  { context: "We breathe in", choices: [" oxygen", " gold", " plastic", " sugar"], answer: 0 },
  { context: "The first letter of the English alphabet is", choices: [" A", " Z", " M", " Q"], answer: 0 },
  { context: "Shakespeare wrote Romeo and", choices: [" Juliet", " Hamlet", " Macbeth", " Othello"], answer: 0 },
  { context: "The chemical symbol for water is", choices: [" H2O", " CO2", " NaCl", " O3"], answer: 0 },
  { context: "The tallest animal on land is the", choices: [" giraffe", " mouse", " penguin", " frog"], answer: 0 },
  { context: "The largest ocean on Earth is the", choices: [" Pacific", " Arctic", " Indian", " Mediterranean"], answer: 0 },
  { context: "A person who writes books is called an", choices: [" author", " engine", " island", " orange"], answer: 0 },
  { context: "Paper is made from", choices: [" wood", " glass", " iron", " stone"], answer: 0 },
  { context: "The day after Monday is", choices: [" Tuesday", " Friday", " Sunday", " Thursday"], answer: 0 },
  { context: "Snow is", choices: [" cold", " hot", " spicy", " loud"], answer: 0 },
  { context: "Cows give us", choices: [" milk", " wool", " eggs", " silk"], answer: 0 },
  { context: "The heart pumps", choices: [" blood", " air", " food", " light"], answer: 0 },
  { context: "To write on a blackboard, teachers use", choices: [" chalk", " soup", " glue", " rope"], answer: 0 },
  { context: "Python is a programming", choices: [" language", " sandwich", " mountain", " holiday"], answer: 0 },
  { context: "The freezing point of water in Fahrenheit is", choices: [" 32 degrees", " 100 degrees", " 0 degrees", " 212 degrees"], answer: 0 },
  { context: "Humans have two eyes and one", choices: [" nose", " tail", " wing", " horn"], answer: 0 },
];
